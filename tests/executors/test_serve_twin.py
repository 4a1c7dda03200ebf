"""``serve --twin``: a warm twin beside the job's executor. It refuses a Start while the executor
lives (no second training thread anywhere), one twin per workdir, and once the executor's
process is gone a Start makes the twin the job's executor in its own process."""

from __future__ import annotations

import os
import signal
import socket
import stat
import time
from collections.abc import Callable
from pathlib import Path

from support.helpers import TINY_CONFIG, ExecutorProcess, wait_for

from executors import exitcodes
from protocol import EXECUTOR_MESSAGES, PROTOCOL_VERSION, recv_message, send_message
from protocol.faults import StopReason
from protocol.messages import (
    ConsoleHello,
    ExecutorHello,
    ExecutorMessage,
    Fault,
    Progress,
    Resumed,
    Start,
    Stop,
    Stopped,
)
from protocol.spec import JobSpec

SPEC = JobSpec(name="tiny", steps=1_000_000, seed=3, checkpoint_every_steps=20, config=TINY_CONFIG)
ARGS = ["--heartbeat-s", "0.2", "--health-s", "0.2"]


class Client:
    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(str(path))
        send_message(self.sock, ConsoleHello(version=PROTOCOL_VERSION, console_id="test"))
        hello = recv_message(self.sock, EXECUTOR_MESSAGES)
        assert isinstance(hello, ExecutorHello)
        self.hello = hello

    def send(self, msg: object) -> None:
        send_message(self.sock, msg)

    def until(
        self, pred: Callable[[ExecutorMessage], bool], timeout: float, what: str
    ) -> ExecutorMessage:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = recv_message(self.sock, EXECUTOR_MESSAGES)
            assert msg is not None, f"connection closed while waiting for {what}"
            if pred(msg):
                return msg
        raise AssertionError(f"no {what} within {timeout}s")

    def close(self) -> None:
        self.sock.close()


def trainers(work: Path) -> set[int]:
    """Every process in /proc with a thread named ``hotspare-train`` whose command line names
    ``work`` (other tests may train on this machine meanwhile). Its helper threads inherit the
    name, so processes are counted, not threads."""
    found: set[int] = set()
    for comm in Path("/proc").glob("[0-9]*/task/*/comm"):
        try:
            if comm.read_text().strip() != "hotspare-train":
                continue
            argv = Path("/proc", comm.parts[2], "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(work).encode() in argv:
            found.add(int(comm.parts[2]))
    return found


def twin(work: Path) -> ExecutorProcess:
    proc = ExecutorProcess(["serve", "--workdir", str(work), "--twin", *ARGS])
    wait_for(lambda: (work / "twin.sock").exists() or proc.proc.poll() is not None, 60, "twin.sock")
    assert proc.proc.poll() is None, proc.finish(5)
    return proc


def test_a_twin_refuses_while_the_executor_lives_and_takes_over_once_it_is_gone(
    tmp_path: Path,
) -> None:
    work = tmp_path / "w"
    primary = ExecutorProcess(["serve", "--workdir", str(work), *ARGS])
    procs = [primary]
    try:
        wait_for(lambda: (work / "executor.sock").exists(), 60, "executor.sock")
        c = Client(work / "executor.sock")
        c.send(Start(spec=SPEC, epoch=1))
        c.until(lambda m: isinstance(m, Progress) and m.step >= 30, 60, "step 30")

        first = twin(work)
        procs.append(first)
        assert stat.S_IMODE(os.stat(work / "twin.sock").st_mode) == 0o600
        assert (work / "twin.pid").read_text().strip() == str(first.proc.pid)
        assert (work / "executor.pid").read_text().strip() == str(primary.proc.pid)
        second = ExecutorProcess(["serve", "--workdir", str(work), "--twin", *ARGS])
        rc, err = second.finish(60)
        assert rc == exitcodes.BUSY
        assert err.strip().count("\n") == 0 and "warm twin" in err and str(first.proc.pid) in err

        t = Client(work / "twin.sock")
        assert (t.hello.state, t.hello.pid) == ("idle", first.proc.pid)
        t.send(Start(spec=SPEC, epoch=2))
        refused = t.until(lambda m: isinstance(m, Fault), 10, "the refusal")
        assert isinstance(refused, Fault) and refused.fault == "workdir_busy"
        stopped = t.until(lambda m: isinstance(m, Stopped), 10, "Stopped")
        assert isinstance(stopped, Stopped) and stopped.reason == "workdir_busy"
        assert first.finish(30)[0] == exitcodes.BUSY
        assert trainers(work) == {primary.proc.pid}, "never two trainers of one job"
        assert not (work / "twin.sock").exists() and not (work / "twin.pid").exists()
        assert (work / "executor.sock").exists(), "the executor's socket is left alone"

        warm = twin(work)  # the refused twin let go of the twin lock
        procs.append(warm)
        wait_for(lambda: (work / "twin.warm").exists(), 60, "the twin warmed up")
        t = Client(work / "twin.sock")
        os.kill(primary.proc.pid, signal.SIGKILL)
        primary.finish(30)
        t.send(Start(spec=SPEC, epoch=2))
        resumed = t.until(lambda m: isinstance(m, Resumed), 30, "Resumed")
        assert isinstance(resumed, Resumed) and resumed.step >= 40 and resumed.epoch == 2
        t.until(
            lambda m: isinstance(m, Progress) and m.step > resumed.step, 30, "a step after the load"
        )
        assert trainers(work) == {warm.proc.pid}
        assert (work / "executor.pid").read_text().strip() == str(warm.proc.pid)
        for gone in ("twin.sock", "twin.pid", "twin.warm"):
            assert not (work / gone).exists(), gone
        again = Client(work / "executor.sock")  # a later console finds it as the executor
        assert (again.hello.pid, again.hello.state, again.hello.epoch) == (
            warm.proc.pid,
            "training",
            2,
        )
        again.send(Stop(reason=StopReason.OPERATOR))
        assert warm.finish(30)[0] == exitcodes.STOPPED
        assert not (work / "executor.sock").exists() and not (work / "executor.pid").exists()
    finally:
        for p in procs:
            if p.proc.poll() is None:
                p.proc.kill()
                p.finish(10)
