"""A local host's kill (a power cut) ends its own cgroup, and touches no other host's: one made
for a start that has not moved into it yet stays, so that start goes on. The evidence is the
cgroup filesystem and /proc."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from support.helpers import alive, wait_for

from console.reach.transport import local_host


@pytest.fixture
def hosts(tmp_path: Path) -> tuple[Path, Path]:
    a = local_host.host_cgroup("a", str(tmp_path / "a"))
    b = local_host.host_cgroup("b", str(tmp_path / "b"))
    if a is None or b is None:
        pytest.skip("this machine gives no cgroup v2 to make the local hosts' in")
    return a, b


def test_a_kill_ends_its_host_and_leaves_another_hosts_empty_cgroup(
    hosts: tuple[Path, Path],
) -> None:
    a, b = hosts
    sleeper = subprocess.Popen(local_host.joined(a, ["sleep", "60"]))
    try:
        procs = a / "cgroup.procs"
        wait_for(lambda: sleeper.pid in {int(p) for p in procs.read_text().split()}, 10, "a's")
        ended = local_host.kill(a, {sleeper.pid})
        assert sleeper.pid in ended
        assert sleeper.wait(timeout=10) == -9
        assert not alive(sleeper.pid)
        assert not a.exists(), "a's own cgroup is gone with its processes"
        assert (b / "cgroup.procs").exists(), "b's, empty, is no business of a's kill"
        started = subprocess.run(local_host.joined(b, ["true"]), check=False)
        assert started.returncode == 0, "a start on b moves into its cgroup as ever"
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()
        local_host.remove_empty(b, itself=True)
