"""CPU seconds per test, every process it started included (``HOTSPARE_TEST_CPU=FILE``).

Each pytest process (each xdist worker) moves itself into a cgroup v1 ``cpuacct`` group of
its own; whatever it starts (executors, sshd hosts, etcd, torch) stays in that group, so the
group's usage over one test is that test's CPU, whichever worker ran beside it. One line per
test is appended to FILE: ``cpu_s wall_s own_s end nodeid``, ``own_s`` the pytest process's own
share (the console under test runs in it), ``end`` when it ended (the epoch's seconds: every
worker's lines on one clock, so the run's timeline can be drawn from them). ``scripts/suite-cpu`` runs the suite this
way and prints the table. Off (and free) unless the variable is set; where the host has no
writable ``cpuacct`` hierarchy it says so once and accounts nothing.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.cgroup_v1 import Group


class Account:
    def __init__(self, out: Path) -> None:
        self.out = out
        self.group = Group("cpuacct", "hotspare-test")

    def usage_s(self) -> float:
        return int(self.group.read("cpuacct.usage")) / 1e9

    def record(self, nodeid: str, cpu_s: float, wall_s: float, own_s: float) -> None:
        line = f"{cpu_s:.2f} {wall_s:.2f} {own_s:.2f} {time.time():.2f} {nodeid}\n".encode()
        fd = os.open(self.out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)  # one write per line: workers' lines never interleave
        finally:
            os.close(fd)


_account: Account | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _account
    out = os.environ.get("HOTSPARE_TEST_CPU")
    if not out:
        return
    try:
        _account = Account(Path(out))
    except OSError as e:
        print(f"HOTSPARE_TEST_CPU: no cpuacct group ({e}); nothing accounted")


def pytest_unconfigure(config: pytest.Config) -> None:
    if _account is not None:
        _account.group.leave()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    if _account is None:
        yield
        return
    cpu, wall, own = _account.usage_s(), time.monotonic(), time.process_time()
    yield
    _account.record(
        item.nodeid,
        _account.usage_s() - cpu,
        time.monotonic() - wall,
        time.process_time() - own,
    )
