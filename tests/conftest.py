"""Shared fixtures: real sshd hosts on loopback (see ``sshbed``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import sshbed


@pytest.fixture
def ssh_bed() -> Iterator[sshbed.SshBed]:
    """A fresh bed (client key, known_hosts); every host it started is killed after the test."""
    with sshbed.ssh_bed() as bed:
        yield bed


@pytest.fixture
def ssh_hosts(ssh_bed: sshbed.SshBed) -> Callable[[int], list[sshbed.SshHost]]:
    """``ssh_hosts(n)``: n started sshd hosts on 127.0.0.2, .3, ... of this test's bed."""
    return lambda n: [ssh_bed.host() for _ in range(n)]
