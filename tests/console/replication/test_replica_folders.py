"""Folder checkpoints (the command kind's; torch.distributed.checkpoint writes one per step)
replicated between local hosts: a folder on the spare, every file verified, the manifest last,
pruned whole, nothing partial left by a failed copy, paths from the manifest refused when they
would leave the folder, promoted and re-replicated (ensure_replica) as folders.
Evidence is the spare's folder on disk and the journal file.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import msgspec
import pytest
from support.replicabed import Bed, manifest_of, write_folder

from console.reach.remote import list_manifests, promote
from console.reach.transport.base import PermanentTransportError
from console.reach.transport.local import LocalTransport
from console.replication.replicator import Source
from console.spares.targets import Targets
from protocol.spec import CheckpointManifest, FolderFile


@pytest.fixture
async def bed(tmp_path: Path):  # type: ignore[no-untyped-def]
    b = Bed(tmp_path)
    try:
        yield b
    finally:
        await b.ctl.close()


async def test_a_folder_is_replicated_as_a_folder_and_pruned_whole(bed: Bed) -> None:
    assert await bed.copy(100)
    bed.holds(100)
    (bed.folder / "step-0000000150.pt").mkdir()  # a folder whose manifest never came
    (bed.folder / "step-0000000150.pt" / "x").write_bytes(b"half")
    (bed.folder / "step-0000000160.pt.part" / "sub").mkdir(parents=True)  # a cut copy's part
    assert await bed.copy(200)
    bed.holds(100, 200)
    assert await bed.copy(300)
    bed.holds(200, 300)
    assert bed.ctl.replicator.replica("j", "b").kept == [200, 300]
    assert bed.failures() == []


async def test_a_file_changed_after_its_manifest_is_refused_and_nothing_is_left(
    bed: Bed,
) -> None:
    assert await bed.copy(100)
    src = bed.source(200)
    shard = bed.checkpoint(200) / "extra" / "rng.bin"
    shard.write_bytes(b"\x01" + shard.read_bytes()[1:])  # one byte, after the manifest
    assert not await bed.ctl.replicator.copy("j", "b", src)
    bed.holds(100)
    (failed,) = bed.failures()
    assert "extra/rng.bin" in failed.data["error"] and "does not match" in failed.data["error"]


@pytest.mark.parametrize(
    "path", ["../escaped", "/tmp/escaped", "a/../../escaped", "./a", "a//b", "a/", "."]
)
async def test_a_manifest_path_outside_the_folder_is_refused_before_anything_is_written(
    bed: Bed, tmp_path: Path, path: str
) -> None:
    """The manifest adds up (size and sha256 over its list), only a path is unsafe."""
    step = 100
    listed = write_folder(bed.checkpoint(step), {"ok.bin": b"fine"})
    listed.append(FolderFile(path=path, size=3, sha256=hashlib.sha256(b"bad").hexdigest()))
    src = Source("a", str(bed.checkpoint(step)), manifest_of(step, listed))
    assert not await bed.ctl.replicator.copy("j", "b", src)
    (failed,) = bed.failures()
    assert "refused: manifest:" in failed.data["error"] and repr(path) in failed.data["error"]
    assert not bed.folder.exists(), "nothing written, not even the replica folder"
    assert not (tmp_path / "b" / "replicas" / "escaped").exists()
    assert not Path("/tmp/escaped").exists()


async def test_an_unsafe_replica_on_the_spare_is_neither_listed_nor_promoted(
    bed: Bed, tmp_path: Path
) -> None:
    """A spare's replica whose manifest was changed there to name '../..': listing skips it,
    promoting it refuses and writes nothing; a sound older one promotes as a folder of links."""
    assert await bed.copy(100)
    assert await bed.copy(200)
    m = msgspec.json.decode(
        (bed.folder / "step-0000000200.json").read_bytes(), type=CheckpointManifest
    )
    bad = [
        *(m.files or []),
        FolderFile(path="../../x", size=0, sha256=hashlib.sha256().hexdigest()),
    ]
    (bed.folder / "step-0000000200.json").write_bytes(msgspec.json.encode(manifest_of(200, bad)))
    b, python = LocalTransport("b"), bed.ctl.inv.python("b")
    found = await list_manifests(b, python, str(bed.folder))
    assert [m.step for m in found] == [100]
    dst = tmp_path / "b" / "jobs" / "j" / "checkpoints"
    dst.mkdir(parents=True)
    (dst / "kept").write_bytes(b"untouched")
    with pytest.raises(PermanentTransportError, match="leaves the folder"):
        await promote(b, python, str(bed.folder), str(dst), 200)
    assert os.listdir(dst) == ["kept"], "a refused promotion writes nothing"
    await promote(b, python, str(bed.folder), str(dst), 100)
    bed.holds(100, folder=dst)
    for rel in ("__0_0.distcp", "extra/deeper/empty"):
        assert os.path.samefile(
            dst / "step-0000000100.pt" / rel, bed.folder / "step-0000000100.pt" / rel
        )


async def test_a_replica_whose_data_is_gone_is_neither_listed_nor_promoted_as_done(
    bed: Bed, tmp_path: Path
) -> None:
    """A manifest left without its data: listing skips it, and promoting that step is an
    error that writes nothing (it used to succeed with the step missing, so a multi-host
    member was started on a step it could not load); no such step at all is the same."""
    assert await bed.copy(100)
    assert await bed.copy(200)
    shutil.rmtree(bed.folder / "step-0000000200.pt")
    b, python = LocalTransport("b"), bed.ctl.inv.python("b")
    assert [m.step for m in await list_manifests(b, python, str(bed.folder))] == [100]
    dst = tmp_path / "b" / "jobs" / "j" / "checkpoints"
    dst.mkdir(parents=True)
    (dst / "kept").write_bytes(b"untouched")
    with pytest.raises(PermanentTransportError, match="step-0000000200: its data is gone"):
        await promote(b, python, str(bed.folder), str(dst), 200)
    with pytest.raises(PermanentTransportError, match="step-0000000300: no such replica"):
        await promote(b, python, str(bed.folder), str(dst), 300)
    assert os.listdir(dst) == ["kept"], "a refused promotion writes nothing"


async def test_ensure_replica_copies_the_newest_folder_replica_to_a_new_host(
    bed: Bed, tmp_path: Path
) -> None:
    assert await bed.copy(100)
    assert await bed.copy(200)
    sup = bed.ctl.jobs["j"]
    targets = Targets(
        sup.live, inv=bed.ctl.inv, fleet=bed.ctl.fleet, replicator=bed.ctl.replicator,
        reserved=dict,
    )  # fmt: skip
    await targets.ensure_replica("c", None)
    bed.holds(200, folder=tmp_path / "c" / "replicas" / "j")
    assert bed.failures() == []
