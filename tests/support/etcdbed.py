"""A real etcd cluster on loopback for standby-controller tests (Debian's ``etcd-server``).

Each member is its own ``etcd`` process with its own data dir and ports; a member is killed
with SIGKILL as a machine would die. Elections are fast (heartbeat 50 ms, election 500 ms) so
a member's death costs the cluster well under a second.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from console.service.etcd import Etcd, EtcdError

POLL_S = 0.05


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EtcdCluster:
    def __init__(self, root: Path, members: int = 3) -> None:
        self.root = root
        self.names = [f"m{i}" for i in range(members)]
        self.client: dict[str, int] = {}
        self.peer: dict[str, int] = {}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._tries = 0
        self._pick_ports()

    def _pick_ports(self) -> None:
        """Six distinct free ports. A port is free only when asked: another process on the
        host (an ssh client's ephemeral port, another test's member) may take it before the
        member binds it, so ``start`` checks every member and starts again if one failed."""
        ports: list[int] = []
        while len(ports) < 2 * len(self.names):
            if (port := free_port()) not in ports:
                ports.append(port)
        self.client = dict(zip(self.names, ports[: len(self.names)], strict=True))
        self.peer = dict(zip(self.names, ports[len(self.names) :], strict=True))

    @property
    def endpoints(self) -> list[str]:
        return [f"127.0.0.1:{self.client[n]}" for n in self.names]

    def start(self, timeout: float = 60, tries: int = 3) -> None:
        """Every member up and answering, not only a quorum: a test that kills one member
        must leave two (a member that failed to bind its port had left a cluster of two, and
        the first kill took its quorum away)."""
        for attempt in range(1, tries + 1):
            self._tries = attempt
            for n in self.names:
                self._launch(n, "new")
            why = self._all_answer(timeout)
            if why is None:
                return
            self.stop()
            if attempt == tries:
                raise AssertionError(f"etcd cluster never came up whole: {why}")
            for n in self.names:
                shutil.rmtree(self.root / n, ignore_errors=True)
            self._pick_ports()

    def _all_answer(self, timeout: float) -> str | None:
        """None once a write lands through each member; else why not (a member exited, or
        the deadline passed)."""
        deadline = time.monotonic() + timeout
        for n, endpoint in zip(self.names, self.endpoints, strict=True):
            while True:
                if not self.alive(n):
                    return f"member {n} exited (code {self.procs[n].returncode}); see {n}.log"
                try:
                    Etcd([endpoint]).txn([], [])
                    break
                except EtcdError as e:
                    if time.monotonic() > deadline:
                        return f"member {n}: {e}"
                time.sleep(POLL_S)  # polling, bounded by the deadline above
        return None

    def _launch(self, n: str, state: str) -> None:
        cluster = ",".join(f"{m}=http://127.0.0.1:{self.peer[m]}" for m in self.names)
        log = (self.root / f"{n}.log").open("ab")
        flags = {
            "--name": n,
            "--data-dir": str(self.root / n),
            "--listen-peer-urls": f"http://127.0.0.1:{self.peer[n]}",
            "--initial-advertise-peer-urls": f"http://127.0.0.1:{self.peer[n]}",
            "--listen-client-urls": f"http://127.0.0.1:{self.client[n]}",
            "--advertise-client-urls": f"http://127.0.0.1:{self.client[n]}",
            "--initial-cluster": cluster,
            "--initial-cluster-state": state,
            "--initial-cluster-token": f"hotspare-test-{id(self)}-{self._tries}",
            "--heartbeat-interval": "50",
            "--election-timeout": "500",
        }
        self.procs[n] = subprocess.Popen(
            ["etcd", *(x for pair in flags.items() for x in pair)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()

    def wait_writable(self, timeout: float) -> None:
        """Until a write lands: the cluster has a leader and a quorum."""
        client = Etcd(self.endpoints)
        deadline = time.monotonic() + timeout
        while True:
            try:
                client.txn([], [])
                return
            except EtcdError as e:
                if time.monotonic() > deadline:
                    raise AssertionError(f"etcd cluster never came up: {e}") from None
            time.sleep(POLL_S)  # polling, bounded by the deadline above

    def alive(self, name: str) -> bool:
        proc = self.procs.get(name)
        return proc is not None and proc.poll() is None

    def restart(self, name: str) -> None:
        """A killed member back, with its data dir: it rejoins the cluster it was in."""
        assert not self.alive(name), f"etcd member {name} is running"
        self._launch(name, "existing")

    def kill(self, name: str) -> None:
        proc = self.procs[name]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)

    def stop(self) -> None:
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)


@pytest.fixture(name="etcd_cluster")
def etcd_cluster_fixture(tmp_path: Path) -> Iterator[EtcdCluster]:
    assert shutil.which("etcd"), "etcd is needed (scripts/test installs etcd-server)"
    root = tmp_path / "etcd"
    root.mkdir()
    cluster = EtcdCluster(root)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
