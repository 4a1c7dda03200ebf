"""A spare's disk that fills up: replicas to it fail cleanly and say so (a disk_full incident in
the journal), leave no partial file, and recover once space is back. The spare's disk is a
small tmpfs mounted by the test (root needed), filled to the last byte as the chaos fault does.

Evidence is read from outside the console: the folder on the tmpfs, statvfs, the journal file.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from support.fleetbed import job_table, local_host, write_inventory
from support.helpers import fill_disk

from console.controller import Controller
from console.inventory import load
from console.reach.deploy import replica_dir
from console.reach.transport.base import TemporaryTransportError, Transport
from console.reach.transport.local import LocalTransport
from console.records.incidents import Incident, incidents
from console.records.journal import Event, Kind, read
from console.replication.replicator import Source
from console.supervise.policy import Policy
from console.ui.view import replica_cell
from console.ui.view_detail import replica_lines
from protocol.spec import CheckpointManifest
from protocol.units import size

SIZE = 300_000
"""A checkpoint: the 4 MiB disk (conftest's ``small_disk``) holds about a dozen."""


def fill(disk: Path) -> Path:
    """Fill the disk to the last byte (as tests/chaos/faults.py disk_full does)."""
    return fill_disk(disk)


class Bed:
    """A console (no jobs) with a primary ``a`` on the ordinary disk and a spare ``b``."""

    def __init__(self, tmp_path: Path, spare: dict[str, Any]) -> None:
        self.a_root = tmp_path / "a"
        inv = write_inventory(
            tmp_path / "inventory.toml",
            hosts={"a": local_host(self.a_root), "b": spare},
            jobs={"j": {"host": "a", "spares": ["b"], **job_table()}},  # never started here
            min_free_disk_gb=0.0,
            replicas_kept=2,
        )
        self.ctl = Controller(load(inv), Policy.AUTO)
        self.folder = Path(replica_dir(spare["root"], "j"))

    def source(self, step: int) -> Source:
        """A checkpoint of ``step`` on a: random bytes and their manifest."""
        data = os.urandom(SIZE)
        path = self.a_root / "jobs" / "j" / "checkpoints" / f"step-{step:010d}.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        m = CheckpointManifest(
            job="j",
            step=step,
            file=path.name,
            size=SIZE,
            sha256=hashlib.sha256(data).hexdigest(),
            epoch=1,
            spec_hash="x",
            code_version="x",
            created_at=time.time(),
        )
        return Source("a", str(path), m)

    async def copy(self, step: int) -> bool:
        return await self.ctl.replicator.copy("j", "b", self.source(step))

    def on_disk(self) -> list[str]:
        return sorted(os.listdir(self.folder))

    def holds(self, *steps: int) -> None:
        """The spare's folder holds exactly these replicas, each with the source's bytes."""
        want = sorted(f"step-{s:010d}.{ext}" for s in steps for ext in ("json", "pt"))
        assert self.on_disk() == want
        for s in steps:
            name = f"step-{s:010d}.pt"
            assert (self.folder / name).read_bytes() == (
                self.a_root / "jobs" / "j" / "checkpoints" / name
            ).read_bytes()

    def events(self) -> list[Event]:
        return list(read(self.ctl.journal.path))

    def disk_incidents(self) -> list[Incident]:
        return [i for i in incidents(self.events()) if i.fault_class == "disk_full"]

    def failed_replicas(self) -> list[Event]:
        return [e for e in self.events() if e.kind is Kind.REPLICA and not e.data["ok"]]


@pytest.fixture
async def bed(tmp_path: Path, small_disk: Path) -> AsyncIterator[Bed]:
    b = Bed(tmp_path, local_host(small_disk))
    try:
        yield b
    finally:
        await b.ctl.close()


async def test_a_full_spare_fails_cleanly_opens_an_incident_and_recovers(
    bed: Bed, small_disk: Path
) -> None:
    assert await bed.copy(100)
    filler = fill(small_disk)
    assert not await bed.copy(200)
    bed.holds(100)  # nothing of step 200, no part file
    (failed,) = bed.failed_replicas()
    assert failed.data["errno"] == errno.ENOSPC and failed.data["step"] == 200
    (incident,) = bed.disk_incidents()
    assert (incident.host, incident.resolved) == ("b", False)
    st = bed.ctl.replicator.replica("j", "b")
    assert st.disk is not None and st.disk.free == 0
    shown = replica_lines(bed.ctl, "j")
    assert shown.startswith("b: step 100") and "disk 0 B free of 4.0 MiB" in shown
    assert shown.endswith("DISK FULL") and replica_cell(bed.ctl, "j", "b", 0).endswith("DISK FULL")

    filler.unlink()
    assert await bed.copy(300)
    bed.holds(100, 300)
    (incident,) = bed.disk_incidents()
    assert incident.resolved, "a replica reached the spare again"
    vfs = os.statvfs(small_disk)
    assert st.disk is not None and st.disk.free == vfs.f_bavail * vfs.f_frsize
    assert time.time() - st.disk_at < 30
    shown = replica_lines(bed.ctl, "j")
    assert "step 300" in shown and f"disk {size(vfs.f_bavail * vfs.f_frsize)} free" in shown
    assert "DISK FULL" not in shown
    assert replica_cell(bed.ctl, "j", "b", 300).startswith("b @300 (lag 0, ")


async def test_filled_between_the_write_and_the_prune_is_caught(
    tmp_path: Path, small_disk: Path
) -> None:
    """Chaos seed 11: the disk filled right after a replica landed, before the oldest was
    pruned. The old order (copy, then prune) freed exactly one replica's room for the next
    copy, every time, so the full disk never showed. Here it must: the next copy fails."""
    bed = Bed(tmp_path, local_host(small_disk))
    filled: list[Path] = []

    class FillsAfterTheManifest(LocalTransport):
        async def rename(self, src: str, dst: str, *, timeout: float | None = None) -> None:
            await super().rename(src, dst, timeout=timeout)
            if armed and dst.endswith(".json"):  # the copy's last write has landed
                filled.append(fill(small_disk))

    armed = False
    bed.ctl.fleet.hosts["b"].transport = FillsAfterTheManifest("b")
    try:
        assert await bed.copy(100)
        assert await bed.copy(200)
        armed = True
        assert await bed.copy(300)  # the disk filled the moment it landed
        armed = False
        assert filled
        assert not await bed.copy(400), "no room for a replica and one more checkpoint"
        assert "step-0000000400.pt" not in bed.on_disk()
        assert not [n for n in bed.on_disk() if n.endswith(".part")]
        (failed,) = bed.failed_replicas()
        assert failed.data["errno"] == errno.ENOSPC
        assert [i.resolved for i in bed.disk_incidents()] == [False]

        filled[0].unlink()
        assert await bed.copy(500)
        bed.holds(300, 500)
        assert [i.resolved for i in bed.disk_incidents()] == [True]
    finally:
        await bed.ctl.close()


def _fills_on_data_write(base: type[Transport], disk: Path) -> Callable[..., Transport]:
    """A transport of ``base`` that fills the disk as the replica's data starts to arrive:
    after the free-space check passed, so the write itself meets ENOSPC."""

    class FillsOnWrite(base):  # type: ignore[misc,valid-type]
        fills = 1

        async def write_chunks(
            self, path: str, chunks: AsyncIterator[bytes], *, offset: int = 0
        ) -> int:
            if path.endswith(".pt.part") and self.fills and "0200" in path:
                self.fills -= 1
                fill(disk)
            return await super().write_chunks(path, chunks, offset=offset)

    return FillsOnWrite


def _fills_once_ready(disk: Path) -> type[Transport]:
    """The ssh transport, whose spare receives a replica in one program: it fills the disk once
    that program has found room for the replica of step 200 and waits for its data, so the
    write itself meets ENOSPC."""
    from console.reach.transport.ssh import SshTransport

    class Ready:
        """The program's process, whose stdout fills the disk on reading the ready line."""

        def __init__(self, proc: Any) -> None:
            self.proc, self.stdout = proc, self

        def __getattr__(self, name: str) -> Any:
            return getattr(self.proc, name)

        async def readline(self) -> bytes:
            line: bytes = await self.proc.stdout.readline()
            if b'"ready"' in line:
                fill(disk)
            return line

    class FillsOnceReady(SshTransport):
        fills = 1

        @contextlib.asynccontextmanager
        async def process(self, argv: Any, what: str, timeout: float) -> AsyncIterator[Any]:
            async with super().process(argv, what, timeout) as proc:
                if self.fills and "0200" in what:
                    self.fills -= 1
                    proc = Ready(proc)
                yield proc

    return FillsOnceReady


async def _disk_full_mid_copy(bed: Bed, disk: Path, make: Callable[[], Transport]) -> None:
    bed.ctl.fleet.hosts["b"].transport = make()
    try:
        assert await bed.copy(100)
        assert not await bed.copy(200)
        bed.holds(100)  # the half-written part is gone
        (failed,) = bed.failed_replicas()
        assert failed.data["errno"] == errno.ENOSPC, failed.data["error"]
        assert "No space left" in failed.data["error"], "the write failed, not the room check"
        assert len(bed.disk_incidents()) == 1, "recognised by its errno"
        (disk / "filler").unlink()
        assert await bed.copy(300)
        bed.holds(100, 300)
        assert [i.resolved for i in bed.disk_incidents()] == [True]
    finally:
        await bed.ctl.close()


async def test_disk_full_during_the_write_local(tmp_path: Path, small_disk: Path) -> None:
    bed = Bed(tmp_path, local_host(small_disk))
    cls = _fills_on_data_write(LocalTransport, small_disk)
    await _disk_full_mid_copy(bed, small_disk, lambda: cls("b"))


async def test_disk_full_during_the_write_ssh(  # type: ignore[no-untyped-def]
    tmp_path: Path, small_disk: Path, ssh_hosts
) -> None:
    from console.reach.transport.ssh import SshTransport

    (h,) = ssh_hosts(1)
    bed = Bed(tmp_path, h.inventory_table(root=str(small_disk)))
    ssh = bed.ctl.fleet.hosts["b"].transport
    assert isinstance(ssh, SshTransport)
    cls = _fills_once_ready(small_disk)
    await _disk_full_mid_copy(bed, small_disk, lambda: cls(ssh.target, ssh.tuning))


async def test_only_the_errno_says_disk_full_not_the_words(tmp_path: Path, short_tmp: Path) -> None:
    """A failure whose message mentions space and quota (here, in the spare's path) but whose
    errno is not ENOSPC/EDQUOT opens no disk_full incident."""
    root = short_tmp / "no space left, disk full, over quota"
    bed = Bed(tmp_path, local_host(root))
    try:
        bed.folder.parent.mkdir(parents=True)
        bed.folder.write_bytes(b"not a folder")  # the replica folder cannot be made
        assert not await bed.copy(100)
        assert bed.disk_incidents() == []
        (failed,) = bed.failed_replicas()
        assert "quota" in failed.data["error"] and failed.data["errno"] == errno.EEXIST
    finally:
        await bed.ctl.close()


async def test_a_copy_cut_off_midway_leaves_no_part_and_is_no_disk_incident(
    bed: Bed,
) -> None:
    """The primary's stream drops every time after 10 kB (retries spent): the copy fails as a
    lost connection, its half-written part is removed, and no disk_full incident opens."""

    class Drops(LocalTransport):
        async def read_chunks(
            self, path: str, *, offset: int = 0, chunk: int = 1 << 20
        ) -> AsyncIterator[bytes]:
            async for block in super().read_chunks(path, offset=offset, chunk=chunk):
                yield block[:10_000]
                raise TemporaryTransportError("a: connection lost")

    assert await bed.copy(100)
    bed.ctl.fleet.hosts["a"].transport = Drops("a")
    assert not await bed.copy(200)
    bed.holds(100)
    (failed,) = bed.failed_replicas()
    assert failed.data["errno"] is None and "connection lost" in failed.data["error"]
    assert bed.disk_incidents() == []
