"""A deposed leader orders nothing: once a link of a higher controller term has been opened, a
real ``serve`` executor refuses every order on a link of a lower one (Lease, Stop, Start),
says so in its own events, and keeps the highest term in its workdir for the executor after it.

Evidence: the executor's ``events.jsonl``, its process in ``/proc``, its exit status, its
step rising after the refused Stop, the ``term`` file on disk.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

from support.helpers import TINY_CONFIG, ExecutorProcess, env_with, wait_for

from executors import clock, exitcodes
from protocol import EXECUTOR_MESSAGES, PROTOCOL_VERSION, recv_message, send_message
from protocol.faults import StopReason
from protocol.messages import ConsoleHello, ExecutorHello, Lease, Start, Stop
from protocol.spec import JobSpec

TTL = 30.0


class Link:
    """A controller's side of the socket, opened under ``term``."""

    def __init__(self, path: Path, term: int) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(str(path))
        send_message(self.sock, ConsoleHello(version=PROTOCOL_VERSION, term=term))
        hello = recv_message(self.sock, EXECUTOR_MESSAGES)
        assert isinstance(hello, ExecutorHello)
        self.hello = hello

    def send(self, msg: object) -> None:
        send_message(self.sock, msg)


def events(work: Path) -> list[dict[str, object]]:
    lines = (work / "events.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def refusals(work: Path) -> list[str]:
    return [str(e.get("text")) for e in events(work) if "refused" in str(e.get("text", ""))]


def steps(work: Path) -> int:
    return max((int(e["step"]) for e in events(work) if e.get("kind") == "progress"), default=0)  # type: ignore[call-overload]


def serve(work: Path) -> tuple[ExecutorProcess, Path]:
    proc = ExecutorProcess(
        ["serve", "--workdir", str(work), "--heartbeat-s", "0.2"], env=env_with()
    )
    sock = work / "executor.sock"

    def answers() -> bool:
        assert proc.proc.poll() is None, proc.finish()[1][-2000:]
        try:
            Link(sock, 0).sock.close()
        except OSError:
            return False
        return True

    wait_for(answers, 60, "the executor to serve")
    return proc, sock


def test_orders_from_a_lower_term_are_refused_and_the_term_outlives_the_executor(
    tmp_path: Path,
) -> None:
    work = tmp_path / "j"
    work.mkdir()
    spec = JobSpec(name="j", steps=1_000_000, seed=3, checkpoint_every_steps=50, config=TINY_CONFIG)
    proc, sock = serve(work)
    try:
        old = Link(sock, 4)
        old.send(Start(spec=spec, epoch=1, lease_s=TTL, lease_anchor=clock.now()))
        wait_for(lambda: steps(work) > 5, 60, "training under term 4")
        new = Link(sock, 5)  # the standby, elected: a higher term
        assert (work / "term").read_text().strip() == "5"

        old.send(Lease(epoch=1, ttl_s=TTL, anchor=clock.now()))
        old.send(Stop(reason=StopReason.OPERATOR, checkpoint=False))
        wait_for(lambda: len(refusals(work)) >= 2, 30, "both orders refused")
        said = refusals(work)
        assert "Lease refused" in said[0] and "term 4" in said[0] and "term 5" in said[0]
        assert "Stop refused" in said[1]
        after = steps(work)
        wait_for(lambda: steps(work) > after + 5, 60, "training on after the refused Stop")
        assert proc.proc.poll() is None and Path(f"/proc/{proc.proc.pid}").exists()
        assert not [e for e in events(work) if e.get("kind") == "stopped"]

        new.send(Stop(reason=StopReason.OPERATOR, checkpoint=False))  # obeyed
        code, _ = proc.finish(60)
        assert code == exitcodes.STOPPED
    finally:
        if proc.proc.poll() is None:
            proc.proc.kill()

    # the next executor in this workdir starts from term 5: a Start of term 4 is refused
    before = len(refusals(work))
    proc, sock = serve(work)
    try:
        stale = Link(sock, 4)
        stale.send(Start(spec=spec, epoch=2, lease_s=TTL, lease_anchor=clock.now()))
        wait_for(lambda: len(refusals(work)) > before, 30, "the stale Start refused")
        assert "Start refused" in refusals(work)[-1]
        assert Link(sock, 5).hello.state == "idle", "the refused Start started nothing"
    finally:
        proc.proc.kill()
        proc.finish(30)
