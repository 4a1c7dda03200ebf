"""A job across hosts in the executors' tests: real ``serve`` executors, one per member's workdir,
each connected to by a blocking protocol client, started on one rendezvous as the console would;
and the uninterrupted run of a spec, which every interrupted one must end equal to."""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import msgspec

from executors import exitcodes
from protocol import EXECUTOR_MESSAGES, PROTOCOL_VERSION, recv_message, send_message
from protocol.messages import (
    ConsoleHello,
    ExecutorHello,
    ExecutorMessage,
    Finished,
    Rendezvous,
    RunEnded,
    Start,
    Stopped,
)
from protocol.spec import CheckpointManifest, JobSpec
from support.helpers import ExecutorProcess, wait_for
from support.wire import read_until

TIMEOUT_S = 15.0
"""The collective timeout: how long a member waits for a peer (its executor's start included)."""


class Client:
    """A blocking protocol client, as a console would be; retries the connect until served."""

    def __init__(self, path: Path, timeout: float = 60) -> None:
        self.sock = wait_for(lambda: self._connect(path), timeout, f"a connection to {path}")
        send_message(self.sock, ConsoleHello(version=PROTOCOL_VERSION, console_id="test"))
        hello = recv_message(self.sock, EXECUTOR_MESSAGES)
        assert isinstance(hello, ExecutorHello)
        self.seen: list[ExecutorMessage] = []

    @staticmethod
    def _connect(path: Path) -> socket.socket | None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(10)
        try:
            sock.connect(str(path))
        except (FileNotFoundError, ConnectionRefusedError):
            sock.close()
            return None
        return sock

    def send(self, msg: object) -> None:
        send_message(self.sock, msg)

    def until(self, pred: Callable[[ExecutorMessage], bool], timeout: float) -> ExecutorMessage:
        """The next message to arrive within ``timeout`` that matches."""
        return read_until(self.sock, self.seen, pred, timeout)

    def close(self) -> None:
        self.sock.close()


@dataclass
class Member:
    work: Path
    proc: ExecutorProcess
    client: Client


def serve(works: list[Path], envs: list[dict[str, str] | None] | None = None) -> list[Member]:
    """One executor per workdir, started together (their imports overlap), each connected to."""
    envs = envs or [None] * len(works)
    procs = [
        ExecutorProcess(
            ["serve", "--workdir", str(w), "--heartbeat-s", "0.2", "--health-s", "1"], env=env
        )
        for w, env in zip(works, envs, strict=True)
    ]
    return [Member(w, p, Client(w / "executor.sock")) for w, p in zip(works, procs, strict=True)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(
    members: list[Member],
    spec: JobSpec,
    *,
    epoch: int = 1,
    resume_step: int | None = None,
    address: str = "127.0.0.1",
    logical_ranks: int | None = None,
    deterministic_reduce: bool = False,
    procs_per_host: int = 1,
) -> None:
    """Start every member on one rendezvous (a fresh port, as each epoch gets from the console)."""
    port = free_port()
    addresses = [address] * len(members)
    for rank, m in enumerate(members):
        rv = Rendezvous(
            node_rank=rank,
            addresses=addresses,
            master_port=port,
            resume_step=resume_step,
            timeout_s=TIMEOUT_S,
            logical_ranks=logical_ranks,
            deterministic_reduce=deterministic_reduce,
            procs_per_host=procs_per_host,
        )
        m.client.send(Start(spec=spec, epoch=epoch, rendezvous=rv))


def finished(m: Member) -> Finished:
    done = m.client.until(lambda x: isinstance(x, (Finished, RunEnded, Stopped)), 60)
    assert isinstance(done, Finished), done
    return done


def manifests(work: Path) -> list[CheckpointManifest]:
    return [
        msgspec.json.decode(p.read_bytes(), type=CheckpointManifest)
        for p in sorted((work / "checkpoints").glob("step-*.json"))
    ]


def kill_all(members: list[Member]) -> None:
    for m in members:
        if m.proc.proc.poll() is None:
            m.proc.proc.kill()
        m.proc.finish(30)


@dataclass(frozen=True)
class Reference:
    digest: str
    works: list[Path]


def uninterrupted(root: Path, spec: JobSpec, hosts: int = 2, procs_per_host: int = 1) -> Reference:
    """One uninterrupted run of ``spec`` (2 hosts of one rank each unless told): what every
    interrupted run must end equal to."""
    members = serve([root / f"r{i}" for i in range(hosts)])
    try:
        start(members, spec, procs_per_host=procs_per_host)
        digests = [finished(m).params_sha256 for m in members]
        assert len(set(digests)) == 1, "the ranks ended with different parameters"
        for m in members:
            rc, err = m.proc.finish(30)
            assert rc == exitcodes.OK, err
        return Reference(digests[0], [m.work for m in members])
    finally:
        kill_all(members)
