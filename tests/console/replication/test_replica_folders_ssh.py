"""Folder checkpoints replicated to an sshd spare: the receiving program writes the folder's
files one after another, each verified by its sha256, the manifest last; a byte damaged on the
source or on the way is refused with nothing left; a dropped stream resumes inside the folder;
a path that leaves the folder is refused by the console and by the program on the spare.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from support.replicabed import Bed, Counting, manifest_of, write_folder

from console.reach.transport.base import TemporaryTransportError
from console.reach.transport.local import LocalTransport
from console.reach.transport.ssh import SshTransport
from console.replication.replica import PROGRAM
from console.replication.replicator import Source
from protocol.spec import FolderFile


@pytest.fixture
async def bed(tmp_path: Path, ssh_hosts: Callable[[int], list[Any]]) -> AsyncIterator[Bed]:
    (h,) = ssh_hosts(1)
    b = Bed(tmp_path, h.inventory_table())
    ssh = b.ctl.fleet.hosts["b"].transport
    assert isinstance(ssh, SshTransport)
    b.ctl.fleet.hosts["b"].transport = Counting(ssh.target, ssh.tuning)
    try:
        yield b
    finally:
        await b.ctl.close()


def channels(bed: Bed) -> int:
    t = bed.ctl.fleet.hosts["b"].transport
    assert isinstance(t, Counting)
    return t.channels


async def test_a_folder_goes_over_one_channel_verified_and_pruned_whole(bed: Bed) -> None:
    assert await bed.copy(100)
    (bed.folder / "step-0000000150.pt" / "sub").mkdir(parents=True)  # its manifest never came
    (bed.folder / "step-0000000150.pt" / "sub" / "x").write_bytes(b"half")
    (bed.folder / "step-0000000160.pt.part").mkdir()  # a cut copy's part
    for step in (200, 300):
        assert await bed.copy(step)
    bed.holds(200, 300)
    assert channels(bed) == 3, "one command on the spare per copy, whatever the files"
    assert bed.failures() == []


class Flips(LocalTransport):
    """A source whose stream of one file arrives with its first byte changed."""

    async def read_chunks(
        self, path: str, *, offset: int = 0, chunk: int = 1 << 20
    ) -> AsyncIterator[bytes]:
        first = True
        async for block in super().read_chunks(path, offset=offset, chunk=chunk):
            if first and path.endswith("rng.bin"):
                block = bytes([block[0] ^ 1]) + block[1:]
            first = False
            yield block


@pytest.mark.parametrize("where", ["source", "transit"])
async def test_a_damaged_file_is_refused_and_nothing_is_left(bed: Bed, where: str) -> None:
    assert await bed.copy(100)
    src = bed.source(200)
    if where == "source":  # a byte changed after the manifest was written
        rng = bed.checkpoint(200) / "extra" / "rng.bin"
        rng.write_bytes(b"\x01" + rng.read_bytes()[1:])
    else:
        bed.ctl.fleet.hosts["a"].transport = Flips("a")
    assert not await bed.ctl.replicator.copy("j", "b", src)
    bed.holds(100)
    (failed,) = bed.failures()
    assert "extra/rng.bin: sha256" in failed.data["error"]
    assert "does not match" in failed.data["error"]


async def test_a_dropped_stream_resumes_inside_the_folder(bed: Bed) -> None:
    """The source's stream drops 30 kB into the second file: the next attempt keeps the first
    file (verified) and the 30 kB, and asks the source for the rest of the second only."""
    reads: list[tuple[str, int]] = []

    class DropsOnce(LocalTransport):
        async def read_chunks(
            self, path: str, *, offset: int = 0, chunk: int = 1 << 20
        ) -> AsyncIterator[bytes]:
            reads.append((Path(path).name, offset))
            async for block in super().read_chunks(path, offset=offset, chunk=chunk):
                if reads == [(".metadata", 0), ("__0_0.distcp", 0)]:
                    yield block[:30_000]
                    raise TemporaryTransportError("a: connection lost")
                yield block

    bed.ctl.fleet.hosts["a"].transport = DropsOnce("a")
    assert await bed.copy(100)
    bed.holds(100)
    assert reads == [
        (".metadata", 0),
        ("__0_0.distcp", 0),
        ("__0_0.distcp", 30_000),
        ("__1_0.distcp", 0),
        ("rng.bin", 0),
    ], "the empty file is no read at all"
    assert channels(bed) == 2, "one program per attempt"


async def test_a_path_leaving_the_folder_is_refused_by_console_and_spare(
    bed: Bed, tmp_path: Path
) -> None:
    listed = write_folder(bed.checkpoint(100), {"ok.bin": b"fine"})
    listed.append(FolderFile(path="../escaped", size=3, sha256=hashlib.sha256(b"bad").hexdigest()))
    m = manifest_of(100, listed)
    assert not await bed.ctl.replicator.copy("j", "b", Source("a", str(bed.checkpoint(100)), m))
    (failed,) = bed.failures()
    assert "'../escaped' leaves the folder" in failed.data["error"]
    assert channels(bed) == 0, "refused before the spare was asked"

    header = {
        "folder": str(bed.folder), "step": 100, "size": m.size, "sha256": m.sha256,
        "manifest": "{}", "kept": 2, "floor": 0, "resume": False,
        "files": [[f.path, f.size, f.sha256] for f in listed],
    }  # fmt: skip
    spare = bed.ctl.fleet.hosts["b"].transport
    assert isinstance(spare, SshTransport)
    argv = [bed.ctl.inv.hosts["b"].python, "-I", "-S", "-c", PROGRAM, "5"]
    async with spare.process(argv, "receive", 10) as proc:
        proc.stdin.write(json.dumps(header).encode() + b"\n" + b"finebad")
        proc.stdin.write_eof()
        async with asyncio.timeout(10):
            reply = json.loads(await proc.stdout.readline())
            await proc.wait_closed()
    assert "'../escaped' leaves the folder" in reply["error"] and proc.returncode == 1
    assert not bed.folder.exists(), "the program wrote nothing, not even the replica folder"
    assert not (bed.folder.parent / "escaped").exists()
