"""Shared fixtures: real sshd hosts on loopback (see ``sshbed``)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support import once, sshbed
from support.helpers import tmpfs

SMALL_DISK = 4 << 20
pytest_plugins = [
    "support.cpu_account",  # CPU per test, with HOTSPARE_TEST_CPU=FILE
    "support.hang_dump",  # where a hung test's asyncio tasks wait
]


@pytest.fixture(scope="session", autouse=True)
def shared_references(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Under xdist, references made once per run are kept where every worker finds them
    (``support.once``): beside the workers' own temporary folders, removed with them."""
    if hasattr(request.config, "workerinput"):
        os.environ[once.FOLDER_ENV] = str(tmp_path_factory.getbasetemp().parent / "once")


@pytest.fixture
def ssh_bed() -> Iterator[sshbed.SshBed]:
    """A fresh bed (client key, known_hosts); every host it started is killed after the test."""
    with sshbed.ssh_bed() as bed:
        yield bed


@pytest.fixture
def ssh_hosts(ssh_bed: sshbed.SshBed) -> Callable[[int], list[sshbed.SshHost]]:
    """``ssh_hosts(n)``: n started sshd hosts on 127.0.0.2, .3, ... of this test's bed."""
    return lambda n: [ssh_bed.host() for _ in range(n)]


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A fresh folder with a short path (``/tmp/hXXXXXXXX``), removed after the test: an
    inventory's root under it leaves room for a job's executor socket (107 bytes), which
    xdist's ``tmp_path`` (70 bytes deep) does not for the shipped inventory's hosts."""
    folder = Path(tempfile.mkdtemp(prefix="h", dir="/tmp"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs, unmounted after the test (root needed)."""
    with tmpfs(tmp_path / "disk", str(SMALL_DISK)) as where:
        yield where


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The local hosts' empty cgroups go once every worker is done (a worker's own end may
    come while another still starts executors into them)."""
    if hasattr(session.config, "workerinput"):
        return
    from console.reach.transport.local_host import local_hosts_folder, remove_empty

    folder = local_hosts_folder()
    if folder is not None and folder.is_dir():
        remove_empty(folder)
