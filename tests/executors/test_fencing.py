"""A stale executor writes nothing: SIGSTOPped past its lease, then SIGCONTed, a real ``serve``
executor publishes no checkpoint and records no step, whichever of its threads wakes first.

Left alone, the watchdog (the main thread) wins that race on this machine every time, so one
test keeps the main thread stopped with ptrace across SIGCONT: the trainer and the checkpoint
writer then wake first, past the lease's end, and must fence themselves.

Evidence is what is on disk (the checkpoints folder, the manifests' bytes, ``events.jsonl``
past the point where the process was stopped), /proc, and the process's exit status.
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import msgspec
import pytest
from support.fencingbed import Client, start_serving
from support.helpers import TINY_CONFIG, ExecutorProcess, wait_for

from executors import clock, exitcodes
from executors.fencing.publish import PUBLISH_MARGIN_S, Fenced, LeaseCheck, publish
from protocol.messages import (
    CheckpointSaved,
    Heartbeat,
    Lease,
    Progress,
    Start,
)
from protocol.spec import CheckpointManifest, CommandSpec, JobSpec

TTL = 2.0
SCRIPT = Path(__file__).resolve().parent.parent / "train_plain.py"


@dataclass(frozen=True)
class Cycle:
    delay_s: float
    """From the last renewal to SIGSTOP (the lease then has TTL - delay_s left)."""
    past_end_s: float
    """How long past the lease's end the executor stays stopped."""
    inject: str = ""


@dataclass(frozen=True)
class Frozen:
    """What was on disk the moment the executor stopped."""

    files: dict[str, bytes]
    tmp: set[str]
    offset: int
    lease_end: float


_libc = ctypes.CDLL(None, use_errno=True)
_libc.ptrace.restype = ctypes.c_long
_libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
PTRACE_DETACH, PTRACE_SEIZE, WALL = 17, 0x4206, 0x40000000


class Held:
    """One thread of a stopped process kept stopped across SIGCONT (a ptrace-stop), so the
    process's other threads run first."""

    def __init__(self, tid: int) -> None:
        if _libc.ptrace(PTRACE_SEIZE, tid, None, None) != 0:
            pytest.skip(f"ptrace refused here: {os.strerror(ctypes.get_errno())}")
        _, status = os.waitpid(tid, WALL)
        assert os.WIFSTOPPED(status), status
        self.tid = tid

    def release(self) -> None:
        assert _libc.ptrace(PTRACE_DETACH, self.tid, None, None) == 0, ctypes.get_errno()


def state(pid: int, tid: int | None = None) -> str:
    try:
        raw = Path(f"/proc/{pid}/task/{tid or pid}/stat").read_text()
    except OSError:
        return "gone"
    return raw.rsplit(")", 1)[1].split()[0]


EPOLL_SYSCALLS = {"x86_64": {"232", "281", "441"}, "aarch64": {"22", "441"}}
"""epoll_wait, epoll_pwait, epoll_pwait2: where an idle asyncio loop waits, holding no GIL."""


def in_epoll(pid: int) -> bool:
    """Was the (stopped) main thread in an epoll wait? /proc keeps the syscall across the stop."""
    numbers = EPOLL_SYSCALLS.get(platform.machine())
    if numbers is None:
        pytest.skip(f"epoll syscall numbers unknown on {platform.machine()}")
    return Path(f"/proc/{pid}/syscall").read_text().split()[0] in numbers


def thread_names(pid: int) -> list[str]:
    names = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            names.append(Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip())
        except OSError:
            continue
    return names


def published(work: Path) -> dict[str, bytes]:
    """Every visible file of the checkpoints folder; manifests with their bytes."""
    folder = work / "checkpoints"
    return {
        p.name: p.read_bytes() if p.suffix == ".json" else b""
        for p in folder.iterdir()
        if not p.name.startswith(".")
    }


def train_under_leases(c: Client, spec: JobSpec, epoch: int) -> float:
    """Start and renew on every heartbeat until this epoch has a checkpoint and a step after
    it; the anchor of the last lease sent (its end is anchor + TTL on the executor's clock)."""
    anchor = clock.now()
    c.send(Start(spec=spec, epoch=epoch, lease_s=TTL, lease_anchor=anchor))
    saved = stepped = False
    deadline = time.monotonic() + 90
    while not (saved and stepped):
        assert time.monotonic() < deadline, "no checkpoint and progress under renewed leases"
        msg = c.recv()
        if isinstance(msg, Heartbeat):
            anchor = clock.now()
            c.send(Lease(epoch=epoch, ttl_s=TTL, anchor=anchor))
        saved = saved or (isinstance(msg, CheckpointSaved) and msg.manifest.epoch == epoch)
        stepped = stepped or (isinstance(msg, Progress) and saved)
    return anchor


def renew(c: Client, epoch: int) -> float:
    """Renew the lease now; its anchor."""
    anchor = clock.now()
    c.send(Lease(epoch=epoch, ttl_s=TTL, anchor=anchor))
    return anchor


def freeze(
    work: Path,
    pid: int,
    anchor: float,
    cycle: Cycle,
    *,
    renew: Callable[[], float] | None = None,
) -> Frozen:
    """SIGSTOP ``delay_s`` after the last renewal and wait until ``past_end_s`` past the lease's
    end. With ``renew``, only at a moment the main thread waits in epoll (holding no GIL): each
    try stops and resumes the process until the lease is half spent, then renews it (``renew``
    returns the new anchor) and tries again; a loaded machine may keep the loop busy a while."""
    for _ in range(20):
        wait_for(lambda a=anchor: clock.now() >= a + cycle.delay_s, 5, "the delay before SIGSTOP")
        caught = stop_once(pid, anchor + cycle.delay_s + (TTL - cycle.delay_s) / 2, renew)
        if caught:
            break
        assert renew is not None
        anchor = renew()
    else:
        pytest.fail("never caught the main thread waiting in epoll in 20 leases")
    folder = work / "checkpoints"
    frozen = Frozen(
        files=published(work),
        tmp={p.name for p in folder.iterdir() if p.name.startswith(".")},
        offset=(work / "events.jsonl").stat().st_size,
        lease_end=anchor + TTL,
    )
    assert clock.now() < frozen.lease_end, "stopped inside the lease"
    wait_for(lambda: clock.now() > frozen.lease_end + cycle.past_end_s, TTL + 10, "the end")
    assert state(pid) == "T"
    return frozen


def stop_once(pid: int, until: float, renew: Callable[[], float] | None) -> bool:
    """Leave ``pid`` stopped; with ``renew``, only once its main thread waits in epoll, trying
    until ``until`` on the executor's clock (False: resumed, never caught there)."""
    while True:
        os.kill(pid, signal.SIGSTOP)
        wait_for(lambda: state(pid) == "T", 5, "the executor to be stopped", interval=0.001)
        if renew is None or in_epoll(pid):
            return True
        os.kill(pid, signal.SIGCONT)
        wait_for(lambda: state(pid) != "T", 5, "the executor to go on", interval=0.001)
        if clock.now() >= until:
            return False


def late_events(work: Path, frozen: Frozen) -> list[dict]:
    with open(work / "events.jsonl", "rb") as f:
        f.seek(frozen.offset)
        return [json.loads(line) for line in f.read().splitlines()]


def assert_wrote_nothing(work: Path, frozen: Frozen) -> list[dict]:
    after = published(work)
    assert set(after) <= set(frozen.files), (
        f"published after the lease: {set(after) - set(frozen.files)}"
    )
    for name, data in after.items():
        assert data == frozen.files[name], f"{name} rewritten after the lease"
    late = late_events(work, frozen)
    assert not [e for e in late if e["kind"] == "progress"], "a Progress after the lease's end"
    for e in late:  # only a checkpoint published in time may still be reported
        if e["kind"] == "checkpoint":
            assert Path(e["manifest_path"]).name in frozen.files
    assert any(e["kind"] == "fault" and e["fault"] == "lease_lost" for e in late), late
    return late


def cleanup(proc: ExecutorProcess, c: Client) -> None:
    c.close()
    if proc.proc.poll() is None:
        os.kill(proc.proc.pid, signal.SIGCONT)
        proc.proc.kill()
        proc.finish()


SPEC = JobSpec(
    name="tiny",
    steps=1_000_000,
    seed=3,
    checkpoint_every_steps=1,
    keep_checkpoints=3,
    config=TINY_CONFIG,
)


@pytest.mark.long  # the suite proves the other order (trainer and writer first, below)
def test_stopped_past_its_lease_it_publishes_nothing_when_the_watchdog_wakes_first(
    tmp_path: Path,
) -> None:
    work = tmp_path / "w"
    cycles = [Cycle(0.0, 0.3), Cycle(0.5, 1.0, "slow_write@0.01"), Cycle(0.2, 0.05)]
    for epoch, cycle in enumerate(cycles, start=1):
        proc, c = start_serving(work, cycle.inject)
        try:
            anchor = train_under_leases(c, SPEC, epoch)
            frozen = freeze(work, proc.proc.pid, anchor, cycle)
            os.kill(proc.proc.pid, signal.SIGCONT)
            rc, err = proc.finish(60)
            assert rc == exitcodes.LEASE_LOST, err[-2000:]
            assert_wrote_nothing(work, frozen)
        finally:
            cleanup(proc, c)


def test_stopped_past_its_lease_it_publishes_nothing_when_trainer_and_writer_wake_first(
    tmp_path: Path,
) -> None:
    work = tmp_path / "w"
    cycles = [Cycle(0.1, 0.3, "slow_write@0.01"), Cycle(0.3, 0.05, "slow_write@0.003")]
    writer_fenced = 0
    for epoch, cycle in enumerate(cycles, start=1):
        proc, c = start_serving(work, cycle.inject)
        pid = proc.proc.pid
        try:
            anchor = train_under_leases(c, SPEC, epoch)
            frozen = freeze(work, pid, anchor, cycle, renew=partial(renew, c, epoch))
            held = Held(pid)  # the main thread: event loop and watchdog
            os.kill(pid, signal.SIGCONT)
            wait_for(lambda p=pid: "hotspare-train" not in thread_names(p), 30, "the trainer's end")
            assert state(pid) == "t", "the main thread is still held"
            late = assert_wrote_nothing(work, frozen)
            faults = [e["message"] for e in late if e["kind"] == "fault"]
            assert any("has ended; stopping without writing" in m for m in faults), faults
            if any(n.endswith(".pt.tmp") for n in frozen.tmp):  # a write was in flight
                assert any("not published" in m or "withdrawn" in m for m in faults), faults
                writer_fenced += 1
            stopped = [e for e in late if e["kind"] == "stopped"]
            assert [s["reason"] for s in stopped] == ["lease_lost"]
            held.release()
            rc, err = proc.finish(60)
            assert rc == exitcodes.LEASE_LOST, err[-2000:]
            assert_wrote_nothing(work, frozen)
        finally:
            cleanup(proc, c)
    assert writer_fenced, "no cycle caught a checkpoint write in flight"


def test_a_command_executor_stopped_past_its_lease_takes_no_checkpoint(tmp_path: Path) -> None:
    work = tmp_path / "w"
    argv = [sys.executable, str(SCRIPT), "--checkpoint-dir", "{checkpoint_dir}"]
    argv += ["--resume", "{resume_from}", "--steps", "{steps}", "--marker", "--save-every", "1"]
    spec = JobSpec(
        name="plain",
        executor="command",
        steps=1_000_000,
        keep_checkpoints=3,
        command=msgspec.convert(
            {
                "argv": [*argv, "--step-s", "0.02"],
                "env": {"OMP_NUM_THREADS": "1"},
                "checkpoint_glob": "ckpt-*.pt",
                "complete_marker": "{name}.done",
                "progress_regex": r"step (?P<step>\d+) loss (?P<loss>[0-9.]+)",
            },
            CommandSpec,
        ),
    )
    proc, c = start_serving(work, "")
    try:
        anchor = train_under_leases(c, spec, 1)
        frozen = freeze(work, proc.proc.pid, anchor, Cycle(0.1, 0.5))
        os.kill(proc.proc.pid, signal.SIGCONT)
        rc, err = proc.finish(60)
        assert rc == exitcodes.LEASE_LOST, err[-2000:]
        late = assert_wrote_nothing(work, frozen)
        assert not [e for e in late if e["kind"] == "checkpoint"]
        written = sorted((work / "ckpt").glob("ckpt-*.pt.done"))
        assert len(written) > len([n for n in frozen.files if n.endswith(".json")]), (
            "the command went on writing checkpoints while its executor was stopped"
        )
        started = [
            e["text"]
            for e in map(json.loads, (work / "events.jsonl").read_text().splitlines())
            if e["kind"] == "log" and e["text"].startswith("command started, pid ")
        ]
        pid = int(started[-1].split()[3].rstrip(":"))
        wait_for(lambda: state(pid) in ("gone", "Z"), 10, "the command to be killed")
    finally:
        cleanup(proc, c)


def _manifest(step: int) -> CheckpointManifest:
    return CheckpointManifest(
        job="j",
        step=step,
        file=f"step-{step:010d}.pt",
        size=4,
        sha256="0" * 64,
        epoch=1,
        spec_hash="h",
        code_version="v",
        created_at=0.0,
    )


def test_publish_refuses_near_the_end_and_withdraws_what_the_end_overtook(tmp_path: Path) -> None:
    """The two checks around the renames, each made to fail: a lease with no more than the
    margin left publishes nothing; one that ended during the renames leaves nothing behind."""
    asked: list[float] = []

    def lease(answers: list[bool]) -> LeaseCheck:
        def valid(margin_s: float) -> bool:
            asked.append(margin_s)
            return answers.pop(0)

        return valid

    for step, answers, margins in [
        (1, [False], [PUBLISH_MARGIN_S]),
        (2, [True, False], [PUBLISH_MARGIN_S, 0.0]),
    ]:
        asked.clear()
        tmp = tmp_path / f".step-{step:010d}.pt.tmp"
        tmp.write_bytes(b"data")
        with pytest.raises(Fenced):
            publish(tmp, tmp_path / f"step-{step:010d}.pt", _manifest(step), lease(answers))
        assert asked == margins
        assert sorted(p.name for p in tmp_path.iterdir()) == [], "nothing left, not even temp files"
    tmp = tmp_path / ".step-0000000003.pt.tmp"
    tmp.write_bytes(b"data")
    publish(tmp, tmp_path / "step-0000000003.pt", _manifest(3), lease([True, True]))
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "step-0000000003.json",
        "step-0000000003.pt",
    ]
