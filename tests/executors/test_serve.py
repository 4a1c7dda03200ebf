"""``hotspare-executor serve``: the protocol over its Unix socket, with a real training thread behind it."""

from __future__ import annotations

import json
import os
import socket
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.helpers import TINY_CONFIG, ExecutorProcess, env_with, wait_for

from executors import exitcodes
from protocol import EXECUTOR_MESSAGES, PROTOCOL_VERSION, encode_frame, recv_message, send_message
from protocol.faults import StopReason
from protocol.messages import (
    CheckpointNow,
    CheckpointSaved,
    ConsoleHello,
    ExecutorHello,
    ExecutorMessage,
    Fault,
    Finished,
    Health,
    Heartbeat,
    Lease,
    Ping,
    Progress,
    Resumed,
    Start,
    Stop,
    Stopped,
)
from protocol.spec import JobSpec

SPEC = JobSpec(
    name="tiny", steps=1_000_000, seed=3, checkpoint_every_steps=100_000, config=TINY_CONFIG
)


class Client:
    """A blocking protocol client, as a console would be."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(str(path))

    def hello(self, version: int = PROTOCOL_VERSION) -> ExecutorMessage | None:
        send_message(self.sock, ConsoleHello(version=version, console_id="test"))
        return self.recv()

    def send(self, msg: object) -> None:
        send_message(self.sock, msg)

    def recv(self) -> ExecutorMessage | None:
        return recv_message(self.sock, EXECUTOR_MESSAGES)

    def until(
        self, pred: Callable[[ExecutorMessage], bool], timeout: float, what: str
    ) -> ExecutorMessage:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = self.recv()
            assert msg is not None, f"connection closed while waiting for {what}"
            if pred(msg):
                return msg
        raise AssertionError(f"no {what} within {timeout}s")

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[ExecutorProcess, Path]]:
    work = tmp_path / "w"
    proc = ExecutorProcess(
        ["serve", "--workdir", str(work), "--heartbeat-s", "0.2", "--health-s", "0.2"]
    )
    wait_for(
        lambda: (work / "executor.sock").exists() or proc.proc.poll() is not None, 60, "the socket"
    )
    assert proc.proc.poll() is None, proc.stderr
    yield proc, work
    if proc.proc.poll() is None:
        proc.proc.kill()
    proc.finish()


def test_serve_round_trip(served: tuple[ExecutorProcess, Path]) -> None:
    proc, work = served
    sock_path = work / "executor.sock"
    assert stat.S_IMODE(os.stat(sock_path).st_mode) == 0o600
    assert (work / "executor.pid").read_text().strip() == str(proc.proc.pid)

    c = Client(sock_path)
    hello = c.hello()
    assert isinstance(hello, ExecutorHello)
    assert (hello.state, hello.version, hello.pid) == ("idle", PROTOCOL_VERSION, proc.proc.pid)
    c.send(Start(spec=SPEC, epoch=1))
    assert isinstance(c.until(lambda m: isinstance(m, Resumed), 60, "Resumed"), Resumed)
    c.until(lambda m: isinstance(m, Progress) and m.step > 5, 30, "Progress")
    beat = c.until(lambda m: isinstance(m, Heartbeat), 5, "Heartbeat")
    assert isinstance(beat, Heartbeat)
    assert (beat.state, beat.epoch) == ("training", 1)
    health = c.until(lambda m: isinstance(m, Health), 5, "Health")
    assert isinstance(health, Health)
    assert health.gpu_status.startswith("no GPU")
    assert health.disk_total_mb > 0
    c.send(Ping(nonce=42))
    c.until(lambda m: isinstance(m, Heartbeat) and m.nonce == 42, 5, "the Ping's answer")
    c.send(CheckpointNow(reason="test"))
    saved = c.until(lambda m: isinstance(m, CheckpointSaved), 10, "CheckpointSaved")
    assert isinstance(saved, CheckpointSaved)
    assert saved.manifest.epoch == 1
    assert Path(saved.path).exists()
    step_at_disconnect = saved.manifest.step
    c.close()

    def logged_step() -> int:
        lines = (work / "events.jsonl").read_text().splitlines()
        return max((json.loads(x).get("step", 0) for x in lines if '"progress"' in x), default=0)

    wait_for(
        lambda: logged_step() > step_at_disconnect + 100, 30, "training to go on with no client"
    )
    c = Client(sock_path)
    again = c.hello()
    assert isinstance(again, ExecutorHello)
    assert (again.state, again.job) == ("training", "tiny")
    assert again.step > step_at_disconnect
    c.send(Stop(reason=StopReason.OPERATOR))
    stopped = c.until(lambda m: isinstance(m, Stopped), 30, "Stopped")
    assert isinstance(stopped, Stopped)
    assert stopped.reason is StopReason.OPERATOR, "the reason told, decoded as the enum"
    assert stopped.checkpoint_step == stopped.step
    rc, _ = proc.finish(30)
    assert rc == exitcodes.STOPPED
    assert not sock_path.exists()
    assert not (work / "executor.pid").exists()


def test_bad_bytes_close_that_client_only(served: tuple[ExecutorProcess, Path]) -> None:
    proc, work = served
    sock_path = work / "executor.sock"
    c = Client(sock_path)
    c.sock.sendall(b"\x00\x00\x00\x05garbage, not msgpack")
    fault = c.recv()
    assert isinstance(fault, Fault)
    assert fault.fault == "protocol"
    assert "invalid console->executor message" in fault.message
    assert c.recv() is None, "the server closes the connection"

    c = Client(sock_path)
    c.sock.sendall(b"\xff\xff\xff\xff")  # a 4 GiB frame
    fault = c.recv()
    assert isinstance(fault, Fault)
    assert "exceeds" in fault.message
    assert c.recv() is None

    c = Client(sock_path)
    fault = c.hello(version=PROTOCOL_VERSION + 1)
    assert isinstance(fault, Fault)
    assert "version" in fault.message

    c = Client(sock_path)
    c.sock.sendall(encode_frame(ConsoleHello(version=PROTOCOL_VERSION))[:7])
    c.sock.shutdown(socket.SHUT_WR)  # truncated frame, then EOF
    fault = c.recv()
    assert isinstance(fault, Fault)
    assert "truncated" in fault.message

    c = Client(sock_path)
    hello = c.hello()
    assert isinstance(hello, ExecutorHello), "the server is still serving"
    c.send(Stop())
    rc, _ = proc.finish(30)
    assert rc == exitcodes.STOPPED


def test_lease_not_renewed_checkpoints_and_stops_before_it_ends(
    served: tuple[ExecutorProcess, Path],
) -> None:
    proc, work = served
    c = Client(work / "executor.sock")
    c.hello()
    ttl = 4.0
    started = time.monotonic()
    c.send(Start(spec=SPEC, epoch=2, lease_s=ttl))
    last_renewal = started
    while (
        time.monotonic() - started < ttl + 2
    ):  # renewed on every heartbeat, past the first lease's end
        msg = c.until(lambda m: isinstance(m, Heartbeat), 5, "Heartbeat")
        assert isinstance(msg, Heartbeat)
        assert msg.state == "training"
        last_renewal = time.monotonic()
        c.send(Lease(epoch=2, ttl_s=ttl))
    stopped = c.until(lambda m: isinstance(m, Stopped), ttl + 5, "Stopped")
    assert time.monotonic() < last_renewal + ttl, "stopped before the lease ended"
    assert isinstance(stopped, Stopped)
    assert stopped.reason == "lease_lost"
    assert stopped.checkpoint_step == stopped.step
    assert (work / "checkpoints" / f"step-{stopped.step:010d}.json").exists()
    rc, _ = proc.finish(30)
    assert rc == exitcodes.LEASE_LOST


def test_a_higher_epoch_stops_a_stale_executor_without_writing(
    served: tuple[ExecutorProcess, Path],
) -> None:
    proc, work = served
    c = Client(work / "executor.sock")
    c.hello()
    c.send(Start(spec=SPEC, epoch=1))
    c.until(lambda m: isinstance(m, Progress) and m.step > 5, 60, "Progress")
    before = sorted((work / "checkpoints").glob("*"))
    c.send(Lease(epoch=2, ttl_s=10))
    fault = c.until(lambda m: isinstance(m, Fault), 10, "Fault")
    assert isinstance(fault, Fault)
    assert "stale" in fault.message
    stopped = c.until(lambda m: isinstance(m, Stopped), 10, "Stopped")
    assert isinstance(stopped, Stopped)
    assert stopped.reason == "stale_epoch"
    rc, _ = proc.finish(30)
    assert rc == exitcodes.LEASE_LOST
    assert sorted((work / "checkpoints").glob("*")) == before, (
        "a stale executor writes nothing more"
    )


@pytest.mark.long  # the suite's served torch runs end Finished, exit 0 (test_serve_restart,
# test_dist_train's group of one started with no rendezvous)
def test_a_served_job_runs_to_the_end_and_reports_finished(
    served: tuple[ExecutorProcess, Path],
) -> None:
    proc, work = served
    c = Client(work / "executor.sock")
    c.hello()
    c.send(
        Start(
            spec=JobSpec(
                name="short", steps=40, seed=3, checkpoint_every_steps=10, config=TINY_CONFIG
            )
        )
    )
    done = c.until(lambda m: isinstance(m, Finished), 60, "Finished")
    assert isinstance(done, Finished)
    assert done.step == 40
    assert len(done.params_sha256) == 64
    rc, _ = proc.finish(30)
    assert rc == exitcodes.OK
    assert json.loads((work / "events.jsonl").read_text().splitlines()[-1])["kind"] == "finished"


def test_an_idle_executor_nobody_talks_to_exits(tmp_path: Path) -> None:
    work = tmp_path / "w"
    proc = ExecutorProcess(["serve", "--workdir", str(work), "--idle-exit-s", "1"])
    rc, err = proc.finish(60)
    assert rc == exitcodes.STOPPED, err
    assert (
        json.loads((work / "events.jsonl").read_text().splitlines()[-1])["reason"]
        == StopReason.NO_CONSOLE
    )


def _thread_cpu_ticks(pid: int, name: str) -> int:
    """CPU ticks (user + system) of ``pid``'s thread named ``name``, from /proc; 0 if none."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            if (task / "comm").read_text().strip() != name:
                continue
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        return int(fields[11]) + int(fields[12])
    return 0


def test_an_executor_stopped_mid_warm_up_exits_with_its_code_not_an_abort(
    tmp_path: Path,
) -> None:
    """Torch still running on the warm-up thread while the interpreter finalizes aborts the
    process (SIGABRT, "terminate called without an active exception"): CI saw a console's
    Stop answered that way. The warm-up returns before the executor exits."""
    work = tmp_path / "w"
    proc = ExecutorProcess(
        ["serve", "--workdir", str(work)], env=env_with(HOTSPARE_INJECT="slow_warmup@120")
    )
    pid = proc.proc.pid
    wait_for(
        lambda: _thread_cpu_ticks(pid, "hotspare-warmup") >= 300 or proc.proc.poll() is not None,
        60,
        "the warm-up thread to run torch for three CPU seconds",
    )
    assert proc.proc.poll() is None, proc.stderr
    proc.proc.terminate()
    rc, err = proc.finish(60)
    assert "terminate called" not in err, err
    assert rc == exitcodes.PREEMPTED, err
