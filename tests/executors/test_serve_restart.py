"""The executor is the node's agent: a dead training run is restarted in place, in the same process.

When the run dies (the command exits or is killed, the workload raises), the executor stays,
says so (``RunEnded``, state ``faulted``), and a Start at a higher epoch restarts the run
without a new process; a Stop, a signal or the end of its lease ends it. The checks read
``/proc`` (the executor's pid, the libraries it mapped) and the files on disk, not the
executor's own account.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import pytest
from support.helpers import (
    TINY_CONFIG,
    ExecutorProcess,
    env_with,
    maps_torch,
    plain_command,
    wait_for,
)
from support.wire import read_until

from console.supervise.outcome import Exit, from_events_tail
from executors import exitcodes
from protocol import EXECUTOR_MESSAGES, PROTOCOL_VERSION, recv_message, send_message
from protocol.faults import StopReason
from protocol.messages import (
    ConsoleHello,
    ExecutorHello,
    ExecutorMessage,
    Fault,
    Finished,
    Heartbeat,
    Lease,
    Log,
    Progress,
    Resumed,
    RunEnded,
    Start,
    Stop,
    Stopped,
)
from protocol.spec import CommandSpec, JobSpec

TORCH_JOB = JobSpec(name="tiny", steps=40, seed=3, checkpoint_every_steps=10, config=TINY_CONFIG)


class Client:
    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(str(path))
        send_message(self.sock, ConsoleHello(version=PROTOCOL_VERSION, console_id="test"))
        hello = recv_message(self.sock, EXECUTOR_MESSAGES)
        assert isinstance(hello, ExecutorHello)
        self.hello = hello
        self.seen: list[ExecutorMessage] = []

    def send(self, msg: object) -> None:
        send_message(self.sock, msg)

    def until(self, pred: Callable[[ExecutorMessage], bool], timeout: float) -> ExecutorMessage:
        return read_until(self.sock, self.seen, pred, timeout)


def serve(work: Path, *extra: str, env: dict[str, str] | None = None) -> ExecutorProcess:
    proc = ExecutorProcess(
        ["serve", "--workdir", str(work), "--heartbeat-s", "0.2", "--health-s", "0.5", *extra],
        env=env,
    )
    wait_for(lambda: accepts(work / "executor.sock") or proc.proc.poll() is not None, 60, "socket")
    assert proc.proc.poll() is None, proc.stderr
    return proc


def accepts(path: Path) -> bool:
    """The socket takes connections: its file exists a moment before the executor listens on
    it (CI: a connect in that moment was refused)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        try:
            s.connect(str(path))
        except OSError:
            return False
    return True


@pytest.fixture
def cleanup() -> Iterator[list[ExecutorProcess]]:
    procs: list[ExecutorProcess] = []
    yield procs
    for p in procs:
        if p.proc.poll() is None:
            p.proc.kill()
        p.finish()


def command_job(steps: int = 60, step_s: float = 0.02) -> JobSpec:
    table = plain_command(step_s)
    return JobSpec(
        name="plain",
        executor="command",
        steps=steps,
        keep_checkpoints=3,
        command=msgspec.convert(table, CommandSpec),
    )


def finished_digest(work: Path, spec: JobSpec, cleanup: list[ExecutorProcess]) -> str:
    """The params digest of one uninterrupted run of ``spec``: the bit-exact reference."""
    proc = serve(work, "--kind", spec.executor)
    cleanup.append(proc)
    c = Client(work / "executor.sock")
    c.send(Start(spec=spec, epoch=1, lease_s=60))
    done = c.until(lambda m: isinstance(m, Finished), 120)
    assert isinstance(done, Finished)
    return done.params_sha256


def test_a_crashed_torch_run_restarts_in_place_at_a_higher_epoch_bit_exact(
    tmp_path: Path, cleanup: list[ExecutorProcess]
) -> None:
    reference = finished_digest(tmp_path / "ref", TORCH_JOB, cleanup)
    work = tmp_path / "w"
    proc = serve(work, env=env_with(HOTSPARE_INJECT="crash@15"))
    cleanup.append(proc)
    pid = proc.proc.pid
    c = Client(work / "executor.sock")
    c.send(Start(spec=TORCH_JOB, epoch=1, lease_s=30))
    ended = c.until(lambda m: isinstance(m, RunEnded), 60)
    assert isinstance(ended, RunEnded)
    assert (ended.fault, ended.checkpoint_step) == ("crash", 10)
    assert any(isinstance(m, Fault) and m.fatal for m in c.seen)
    beat = c.until(lambda m: isinstance(m, Heartbeat), 5)
    assert isinstance(beat, Heartbeat) and beat.state == "faulted"
    assert proc.proc.poll() is None and Path(f"/proc/{pid}").exists(), "the executor stayed"

    c.send(Start(spec=TORCH_JOB, epoch=1, lease_s=30))  # not above the epoch that crashed
    warned = c.until(lambda m: isinstance(m, (Log, Resumed)), 5)
    assert isinstance(warned, Log) and "ignored" in warned.text

    c.send(Start(spec=TORCH_JOB, epoch=2, lease_s=30))
    resumed = c.until(lambda m: isinstance(m, Resumed), 30)
    assert isinstance(resumed, Resumed) and (resumed.step, resumed.epoch) == (10, 2)
    done = c.until(lambda m: isinstance(m, Finished), 60)
    assert isinstance(done, Finished)
    assert (done.step, done.params_sha256) == (40, reference)  # the injection fired once only
    rc, err = proc.finish(30)
    assert rc == exitcodes.OK, err
    events = [json.loads(x) for x in (work / "events.jsonl").read_text().splitlines()]
    assert [e["epoch"] for e in events if e["kind"] == "resumed"] == [1, 2]
    assert proc.proc.pid == pid, "one process ran both epochs"


@pytest.mark.long  # the suite proves it through the console, bit-exact, torch never mapped
# (tests/console/supervise/test_restart_in_place.py) and warm (test_command_zygote)
def test_a_killed_command_is_restarted_by_the_same_executor_which_never_imports_torch(
    tmp_path: Path, cleanup: list[ExecutorProcess]
) -> None:
    spec = command_job()
    reference = finished_digest(tmp_path / "ref", spec, cleanup)
    work = tmp_path / "w"
    proc = serve(work, "--kind", "command")
    cleanup.append(proc)
    pid = proc.proc.pid
    c = Client(work / "executor.sock")
    c.send(Start(spec=spec, epoch=1, lease_s=30))
    started = c.until(lambda m: isinstance(m, Log) and m.text.startswith("command started"), 30)
    assert isinstance(started, Log)
    child = int(started.text.split("pid ")[1].split(":")[0])
    c.until(lambda m: isinstance(m, Progress) and m.step >= 25, 60)
    os.kill(child, signal.SIGKILL)
    ended = c.until(lambda m: isinstance(m, RunEnded), 30)
    assert isinstance(ended, RunEnded) and ended.fault == "crash"
    assert ended.checkpoint_step is not None and ended.checkpoint_step >= 20
    wait_for(lambda: not Path(f"/proc/{child}").exists(), 10, "the killed command reaped")

    c.send(Start(spec=spec, epoch=2, lease_s=30))
    resumed = c.until(lambda m: isinstance(m, Resumed), 30)
    assert isinstance(resumed, Resumed) and resumed.step == ended.checkpoint_step
    again = c.until(lambda m: isinstance(m, Log) and m.text.startswith("command started"), 30)
    assert isinstance(again, Log) and f"pid {child}:" not in again.text
    assert not maps_torch(pid), "the command kind's executor loaded torch"
    done = c.until(lambda m: isinstance(m, Finished), 60)
    assert isinstance(done, Finished) and done.params_sha256 == reference
    rc, err = proc.finish(30)
    assert rc == exitcodes.OK, err
    assert proc.proc.pid == pid


def test_only_a_torch_executor_imports_torch_while_idle(
    tmp_path: Path, cleanup: list[ExecutorProcess]
) -> None:
    torch_one = serve(tmp_path / "t")
    command_one = serve(tmp_path / "c", "--kind", "command")
    cleanup += [torch_one, command_one]
    # The torch executor warms up in the background: once it has, the check below can see it.
    wait_for(lambda: maps_torch(torch_one.proc.pid), 60, "the torch executor's warm-up")
    Client(tmp_path / "c" / "executor.sock").until(lambda m: isinstance(m, Heartbeat), 5)
    assert not maps_torch(command_one.proc.pid)


def test_a_faulted_executor_ends_when_its_lease_does(
    tmp_path: Path, cleanup: list[ExecutorProcess]
) -> None:
    work = tmp_path / "w"
    proc = serve(work, env=env_with(HOTSPARE_INJECT="crash@12"))
    cleanup.append(proc)
    c = Client(work / "executor.sock")
    c.send(Start(spec=TORCH_JOB, epoch=1, lease_s=4))

    def renewed_until_it_ends(m: ExecutorMessage) -> bool:
        if isinstance(m, Heartbeat):
            c.send(Lease(epoch=1, ttl_s=4))
        return isinstance(m, RunEnded)

    c.until(renewed_until_it_ends, 60)
    ended_at = time.monotonic()
    stopped = c.until(lambda m: isinstance(m, Stopped), 10)
    assert time.monotonic() - ended_at > 2, "it waited for a restart while its lease lasted"
    assert isinstance(stopped, Stopped)
    assert (stopped.reason, stopped.exit_code) == ("lease_lost", exitcodes.LEASE_LOST)
    rc, err = proc.finish(30)
    assert rc == exitcodes.LEASE_LOST, err
    tail = (work / "events.jsonl").read_text()
    assert from_events_tail(tail).exit is Exit.LEASE_LOST  # the next console restarts it


def test_a_faulted_executor_stops_when_told(tmp_path: Path, cleanup: list[ExecutorProcess]) -> None:
    work = tmp_path / "w"
    proc = serve(work, env=env_with(HOTSPARE_INJECT="crash@12"))
    cleanup.append(proc)
    c = Client(work / "executor.sock")
    c.send(Start(spec=TORCH_JOB, epoch=1, lease_s=30))
    c.until(lambda m: isinstance(m, RunEnded), 60)
    c.send(Stop(reason=StopReason.NOT_NEEDED, checkpoint=False))
    stopped = c.until(lambda m: isinstance(m, Stopped), 10)
    assert isinstance(stopped, Stopped) and stopped.checkpoint_step == 10
    rc, err = proc.finish(30)
    assert rc == exitcodes.STOPPED, err


def test_an_executor_killed_while_faulted_reads_as_the_run_s_crash(tmp_path: Path) -> None:
    tail = "\n".join(
        json.dumps(e)
        for e in (
            {"kind": "progress", "step": 12, "loss": 1.0, "steps_per_s": 1.0, "epoch": 1},
            {"kind": "fault", "fault": "hang", "message": "no progress", "step": 12},
            {"kind": "run_ended", "step": 12, "fault": "hang", "message": "no progress for 9s"},
        )
    )
    outcome = from_events_tail(tail)
    assert outcome.exit is Exit.HUNG and "no progress for 9s" in outcome.why


def test_an_executor_ended_by_its_lease_watchdog_reads_as_a_lost_lease_not_a_crash() -> None:
    """Seen in the suite: an executor SIGSTOPped past its lease, then continued, ends at once
    by its watchdog (a fatal lease_lost fault, no ``stopped``); it was told "died without a
    word (killed?)"."""
    tail = "\n".join(
        json.dumps(e)
        for e in (
            {"kind": "progress", "step": 57, "loss": 1.0, "steps_per_s": 1.0, "epoch": 1},
            {
                "kind": "fault",
                "fault": "lease_lost",
                "message": "lease of epoch 1 has ended; stopping without writing",
                "step": 60,
                "fatal": False,
            },
            {
                "kind": "fault",
                "fault": "lease_lost",
                "message": "lease ended while a step was still running; exiting at once",
                "step": 57,
                "fatal": True,
            },
        )
    )
    outcome = from_events_tail(tail)
    assert outcome.exit is Exit.LEASE_LOST and "exiting at once" in outcome.why, outcome
