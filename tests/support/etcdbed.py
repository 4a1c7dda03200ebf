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
        self.client = {n: free_port() for n in self.names}
        self.peer = {n: free_port() for n in self.names}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def endpoints(self) -> list[str]:
        return [f"127.0.0.1:{self.client[n]}" for n in self.names]

    def start(self) -> None:
        for n in self.names:
            self._launch(n, "new")
        self.wait_writable(60)

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
            "--initial-cluster-token": f"hotspare-test-{id(self)}",
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
