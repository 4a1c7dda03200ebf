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
        cluster = ",".join(f"{n}=http://127.0.0.1:{self.peer[n]}" for n in self.names)
        for n in self.names:
            log = (self.root / f"{n}.log").open("wb")
            flags = {
                "--name": n,
                "--data-dir": str(self.root / n),
                "--listen-peer-urls": f"http://127.0.0.1:{self.peer[n]}",
                "--initial-advertise-peer-urls": f"http://127.0.0.1:{self.peer[n]}",
                "--listen-client-urls": f"http://127.0.0.1:{self.client[n]}",
                "--advertise-client-urls": f"http://127.0.0.1:{self.client[n]}",
                "--initial-cluster": cluster,
                "--initial-cluster-state": "new",
                "--initial-cluster-token": f"hotspare-test-{id(self)}",
                "--heartbeat-interval": "50",
                "--election-timeout": "500",
            }
            self.procs[n] = subprocess.Popen(
                ["etcd", *(x for pair in flags.items() for x in pair)],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        client = Etcd(self.endpoints)
        deadline = time.monotonic() + 60
        while True:
            try:
                client.txn([], [])  # a write: the cluster has a leader and a quorum
                return
            except EtcdError as e:
                if time.monotonic() > deadline:
                    raise AssertionError(f"etcd cluster never came up: {e}") from None
            time.sleep(POLL_S)  # polling, bounded by the deadline above

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
