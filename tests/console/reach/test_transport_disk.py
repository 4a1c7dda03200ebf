"""The transports' disk facts, on both transports against a real tmpfs: a full disk is an error
carrying ENOSPC (and other failures their own errno), statvfs and listings match the disk."""

from __future__ import annotations

import errno
import os
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from support.fleetbed import write_inventory
from support.helpers import fill_disk as fill

from console.inventory import load
from console.reach.transport.base import Transport, TransportError
from console.reach.transport.factory import open_transport
from console.reach.transport.local import LocalTransport


async def _chunks(n: int) -> AsyncIterator[bytes]:
    for _ in range(n):
        yield b"x" * (1 << 20)


@pytest.fixture(params=["local", "ssh"])
def make(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Transport]]:
    if request.param == "local":
        yield lambda: LocalTransport("h")
        return
    (h,) = request.getfixturevalue("ssh_hosts")(1)
    inv = load(
        write_inventory(tmp_path / "inventory.toml", hosts={"h": h.inventory_table()}, jobs={})
    )
    yield lambda: open_transport(inv, "h")


async def test_a_full_disk_is_enospc_and_other_failures_are_not(
    make: Callable[[], Transport],
    small_disk: Path,
) -> None:
    async with make() as t:
        fill(small_disk)
        with pytest.raises(TransportError) as full:
            await t.write_chunks(str(small_disk / "data.part"), _chunks(2))
        assert full.value.errno == errno.ENOSPC and full.value.disk_full
        with pytest.raises(TransportError) as missing:
            await t.write_chunks(str(small_disk / "no" / "such"), _chunks(1))
        assert missing.value.errno == errno.ENOENT and not missing.value.disk_full
        with pytest.raises(TransportError) as gone:
            await t.rename(str(small_disk / "absent"), str(small_disk / "b"))
        assert gone.value.errno == errno.ENOENT


async def test_disk_usage_and_listdir_match_the_disk(
    make: Callable[[], Transport],
    small_disk: Path,
) -> None:
    names = ["a.pt", "b c.json", "d.part"]
    for name in names:
        (small_disk / name).write_bytes(os.urandom(70_000))
    (small_disk / "sub").mkdir()
    async with make() as t:
        usage = await t.disk_usage(str(small_disk))
        listed = await t.listdir(str(small_disk))
        absent = await t.listdir(str(small_disk / "nothing"))
    vfs = os.statvfs(small_disk)
    assert usage.free == vfs.f_bavail * vfs.f_frsize
    assert usage.total == vfs.f_blocks * vfs.f_frsize == 4 << 20
    assert usage.block == vfs.f_frsize
    assert listed == sorted([*names, "sub"])
    assert absent == []
