"""Replicas to an sshd spare: one program on one channel per copy, with every guarantee of the
step-by-step copy (prune first, room checked, a dropped stream resumed, a corrupt one refused,
no part left, the journal's lag). Evidence is the spare's folder on disk and the journal file.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import json
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from support.fleetbed import job_table, local_host, until, write_inventory
from support.helpers import fill_disk as fill
from support.replicabed import Counting

from console import clock
from console.controller import Controller
from console.inventory import load
from console.reach.deploy import replica_dir
from console.reach.transport.base import TemporaryTransportError
from console.reach.transport.local import LocalTransport
from console.reach.transport.ssh import SshTransport
from console.records.journal import Event, Kind, read
from console.replication import replica_rules as rules
from console.replication.replica import PROGRAM
from console.replication.replicator import Source
from console.supervise.policy import Policy
from protocol.spec import CheckpointManifest

SIZE = 300_000


class Bed:
    """A console (its job never started) with a local primary ``a`` and an sshd spare ``b``."""

    def __init__(self, tmp_path: Path, spare: dict[str, Any], kept: int = 2) -> None:
        self.a_root = tmp_path / "a"
        inv = write_inventory(
            tmp_path / "inventory.toml",
            hosts={"a": local_host(self.a_root), "b": spare},
            jobs={"j": {"host": "a", "spares": ["b"], **job_table()}},
            min_free_disk_gb=0.0,
            replicas_kept=kept,
        )
        self.ctl = Controller(load(inv), Policy.AUTO)
        ssh = self.ctl.fleet.hosts["b"].transport
        assert isinstance(ssh, SshTransport)
        self.b = Counting(ssh.target, ssh.tuning)
        self.ctl.fleet.hosts["b"].transport = self.b
        self.folder = Path(replica_dir(spare["root"], "j"))

    def source(self, step: int, *, sha256: str | None = None) -> Source:
        data = os.urandom(SIZE)
        path = self.a_root / "jobs" / "j" / "checkpoints" / f"step-{step:010d}.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        m = CheckpointManifest(
            job="j", step=step, file=path.name, size=SIZE,
            sha256=sha256 or hashlib.sha256(data).hexdigest(), epoch=1, spec_hash="x",
            code_version="x", created_at=time.time(),
        )  # fmt: skip
        return Source("a", str(path), m)

    async def copy(self, step: int, **kw: Any) -> bool:
        return await self.ctl.replicator.copy("j", "b", self.source(step, **kw))

    def holds(self, *steps: int) -> None:
        """The spare's folder holds exactly these replicas, each with the source's bytes and
        its manifest."""
        want = sorted(f"step-{s:010d}.{ext}" for s in steps for ext in ("json", "pt"))
        assert sorted(os.listdir(self.folder)) == want
        for s in steps:
            name = f"step-{s:010d}.pt"
            data = (self.folder / name).read_bytes()
            assert data == (self.a_root / "jobs" / "j" / "checkpoints" / name).read_bytes()
            manifest = msgspec.json.decode(
                (self.folder / name.replace(".pt", ".json")).read_bytes(), type=CheckpointManifest
            )
            assert (manifest.step, manifest.sha256) == (s, hashlib.sha256(data).hexdigest())

    def replicas(self) -> list[Event]:
        return [e for e in read(self.ctl.journal.path) if e.kind is Kind.REPLICA]


@pytest.fixture
async def bed(tmp_path: Path, ssh_hosts: Callable[[int], list[Any]]) -> AsyncIterator[Bed]:
    (h,) = ssh_hosts(1)
    marker = Path.home() / f"pwned-{os.getpid()}"  # where an unquoted $(...) would run
    # under the host's short folder: the hostile name leaves room for a job's executor socket
    root = h.folder / f'b root, it\'s "q" $(touch {marker.name}) `touch {marker.name}`'
    b = Bed(tmp_path, h.inventory_table(root=str(root)))
    try:
        yield b
    finally:
        await b.ctl.close()
    assert not marker.exists(), "a path reached a shell unquoted"


async def test_one_channel_per_copy_prunes_first_and_keeps_the_newest(bed: Bed) -> None:
    assert await bed.copy(100)
    bed.b.channels = 0
    (bed.folder / "step-0000000090.pt.part").write_bytes(b"left by a cut copy")
    (bed.folder / "step-0000000095.pt").write_bytes(b"data whose manifest never came")
    assert await bed.copy(200)
    assert await bed.copy(300)
    assert bed.b.channels == 2, "one command on the spare per copy"
    bed.holds(200, 300)
    assert bed.ctl.replicator.replica("j", "b").kept == [200, 300]
    ok = [e for e in bed.replicas() if e.data["ok"]]
    assert [e.data["step"] for e in ok] == [100, 200, 300]
    vfs = os.statvfs(bed.folder)
    assert ok[-1].data["free_bytes"] == pytest.approx(vfs.f_bavail * vfs.f_frsize, rel=0.01)


async def test_lag_runs_from_the_checkpoint_reaching_the_console(bed: Bed) -> None:
    saved_at = clock.mono() - 5.0
    assert await bed.ctl.replicator.copy("j", "b", bed.source(100), saved_at)
    bed.ctl.replicator.submit("j", ["b"], bed.source(200))
    assert await bed.ctl.replicator.wait_idle("j", "b", 60)
    first, second = (e.data for e in bed.replicas())
    assert 5.0 + first["seconds"] <= first["lag_s"] < 60
    assert second["seconds"] <= second["lag_s"] < 30
    assert bed.ctl.replicator.replica("j", "b").lag_s == second["lag_s"]


async def test_a_dropped_source_stream_resumes_from_the_part(bed: Bed) -> None:
    """The primary's stream drops once after 100 kB: the second attempt resumes from what
    reached the spare, and the replica is whole."""
    sent: list[int] = []

    class DropsOnce(LocalTransport):
        async def read_chunks(
            self, path: str, *, offset: int = 0, chunk: int = 1 << 20
        ) -> AsyncIterator[bytes]:
            sent.append(offset)
            async for block in super().read_chunks(path, offset=offset, chunk=chunk):
                if len(sent) == 1:
                    yield block[:100_000]
                    raise TemporaryTransportError("a: connection lost")
                yield block

    bed.ctl.fleet.hosts["a"].transport = DropsOnce("a")
    assert await bed.copy(100)
    bed.holds(100)
    assert sent == [0, 100_000]


async def test_a_corrupt_stream_is_refused_and_leaves_nothing(bed: Bed) -> None:
    assert await bed.copy(100)
    assert not await bed.copy(200, sha256="0" * 64)
    bed.holds(100)
    (failed,) = [e for e in bed.replicas() if not e.data["ok"]]
    assert "does not match" in failed.data["error"]


async def test_a_full_spare_writes_nothing_and_says_so(  # type: ignore[no-untyped-def]
    tmp_path: Path,
    small_disk: Path,
    ssh_hosts,
) -> None:
    (h,) = ssh_hosts(1)
    bed = Bed(tmp_path, h.inventory_table(root=str(small_disk)))
    try:
        assert await bed.copy(100)
        filler = fill(small_disk)
        assert not await bed.copy(200)
        bed.holds(100)
        (failed,) = [e for e in bed.replicas() if not e.data["ok"]]
        assert failed.data["errno"] == errno.ENOSPC and "disk full" in failed.data["error"]
        st = bed.ctl.replicator.replica("j", "b")
        assert st.full and st.disk is not None and st.disk.free == 0
        filler.unlink()
        assert await bed.copy(300)
        bed.holds(100, 300)
        assert not st.full
    finally:
        await bed.ctl.close()


async def test_replicas_kept_one_keeps_one(tmp_path: Path, ssh_hosts) -> None:  # type: ignore[no-untyped-def]
    (h,) = ssh_hosts(1)
    bed = Bed(tmp_path, h.inventory_table(), kept=1)
    try:
        for step in (100, 200, 300):
            assert await bed.copy(step)
        bed.holds(300)
    finally:
        await bed.ctl.close()


def test_the_rules() -> None:
    names = [
        "step-0000000100.pt", "step-0000000100.json", "step-0000000200.pt",
        "step-0000000300.json", "step-0000000400.pt", "step-0000000400.json",
        "step-0000000400.pt.part", "other",
    ]  # fmt: skip
    complete, leftovers = rules.survey(names)
    assert complete == [100, 400]
    assert leftovers == ["step-0000000200.pt", "step-0000000300.json", "step-0000000400.pt.part"]
    assert rules.split_older([100, 200, 300, 500], 400, 1) == ([100, 200], [300])
    assert rules.split_older([100, 200], 400, 0) == ([100, 200], [])
    assert rules.room(5000, 10, 4096, 0) == (8192 + 4096, 8192)
    assert rules.room(5000, 10, 4096, 1 << 20) == (8192 + 4096, 1 << 20)


async def test_the_spare_program_gives_up_on_a_silent_console(bed: Bed) -> None:
    """Header sent, then no data: the program on the spare stops after its idle timeout
    (here 0.5 s) instead of waiting for ever, and says so."""
    header = {
        "folder": str(bed.folder), "step": 100, "size": SIZE, "sha256": "0" * 64,
        "manifest": "{}", "kept": 2, "floor": 0, "resume": False,
    }  # fmt: skip
    argv = [bed.ctl.inv.hosts["b"].python, "-I", "-S", "-c", PROGRAM, "0.5"]
    async with bed.b.process(argv, "receive", 10) as proc:
        proc.stdin.write(json.dumps(header).encode() + b"\n")
        async with asyncio.timeout(10):
            ready = json.loads(await proc.stdout.readline())
            t0 = time.monotonic()
            gave_up = json.loads(await proc.stdout.readline())
            await proc.wait_closed()
    assert ready["ready"] and gave_up["timeout"] == 0.5
    assert 0.4 < time.monotonic() - t0 < 5 and proc.returncode == 5


async def test_a_copy_cut_by_the_console_closing_leaves_the_next_one_whole(bed: Bed) -> None:
    """The console closes mid-copy (the source stalls): nothing of that copy is complete, and
    the next copy clears what it left and lands whole."""

    class Stalls(LocalTransport):
        async def read_chunks(
            self, path: str, *, offset: int = 0, chunk: int = 1 << 20
        ) -> AsyncIterator[bytes]:
            yield b"x" * 1000
            await asyncio.sleep(3600)

    assert await bed.copy(100)
    bed.ctl.fleet.hosts["a"].transport = Stalls("a")
    bed.ctl.replicator.submit("j", ["b"], bed.source(200))
    await until(lambda: (bed.folder / "step-0000000200.pt.part").exists(), 30, "the part")
    await bed.ctl.replicator.close()
    assert "step-0000000200.json" not in os.listdir(bed.folder)
    bed.ctl.fleet.hosts["a"].transport = LocalTransport("a")
    assert await bed.copy(300)
    bed.holds(100, 300)


async def test_a_spare_whose_table_names_no_python_gets_replicas_all_the_same(
    tmp_path: Path, ssh_hosts: Callable[[int], list[Any]]
) -> None:
    """``python`` left out of a host's table is python3 over ssh (the inventory's default).
    Found by mypy: the replica's plan took the table's None, and the spare's program was
    started as ``None -I -S -c ...``."""
    (h,) = ssh_hosts(1)
    table = h.inventory_table(root=str(tmp_path / "b"))
    del table["python"]
    b = Bed(tmp_path, table)
    try:
        assert await b.copy(100)
        b.holds(100)
    finally:
        await b.ctl.close()
