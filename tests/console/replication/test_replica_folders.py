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
import time
from pathlib import Path

import msgspec
import pytest
from support.fleetbed import job_table, local_host, write_inventory

from console.controller import Controller
from console.inventory import load
from console.reach.deploy import replica_dir
from console.reach.remote import list_manifests, promote
from console.reach.transport.base import PermanentTransportError
from console.reach.transport.local import LocalTransport
from console.records.journal import Event, Kind, read
from console.replication.replicator import Source
from console.spares.targets import Targets
from console.supervise.policy import Policy
from protocol.spec import CheckpointManifest, FolderFile


def shards(step: int) -> dict[str, bytes]:
    """A folder shaped like one dcp.save writes: shards, a nested file, an empty one."""
    return {
        ".metadata": f"metadata of {step}".encode(),
        "__0_0.distcp": os.urandom(70_000),
        "__1_0.distcp": os.urandom(1000),
        "extra/rng.bin": bytes(range(256)),
        "extra/deeper/empty": b"",
    }


def manifest_of(step: int, files: list[FolderFile]) -> CheckpointManifest:
    """A folder's manifest: ``size`` the files' sum, ``sha256`` over ``SHA256 SIZE PATH`` lines."""
    lines = "".join(f"{f.sha256} {f.size} {f.path}\n" for f in sorted(files, key=lambda f: f.path))
    return CheckpointManifest(
        job="j", step=step, file=f"step-{step:010d}.pt", size=sum(f.size for f in files),
        sha256=hashlib.sha256(lines.encode()).hexdigest(), epoch=1, spec_hash="x",
        code_version="x", created_at=time.time(), files=files,
    )  # fmt: skip


def write_folder(folder: Path, files: dict[str, bytes]) -> list[FolderFile]:
    for rel, data in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    return [
        FolderFile(path=rel, size=len(data), sha256=hashlib.sha256(data).hexdigest())
        for rel, data in files.items()
    ]


def tree(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` by its path, and every folder (as None-free b"<dir>")."""
    return {
        str(p.relative_to(folder)): p.read_bytes() if p.is_file() else b"<dir>"
        for p in sorted(folder.rglob("*"))
    }


class Bed:
    """A console (its job never started) with a local primary ``a``, its spare ``b`` (local,
    or a table given) and a third host ``c``."""

    def __init__(self, tmp_path: Path, spare: dict[str, object] | None = None) -> None:
        self.a_root = tmp_path / "a"
        spare = spare or local_host(tmp_path / "b")
        inv = write_inventory(
            tmp_path / "inventory.toml",
            hosts={"a": local_host(self.a_root), "b": spare, "c": local_host(tmp_path / "c")},
            jobs={"j": {"host": "a", "spares": ["b"], **job_table()}},
            min_free_disk_gb=0.0,
            replicas_kept=2,
        )
        self.ctl = Controller(load(inv), Policy.AUTO)
        self.folder = Path(replica_dir(str(spare["root"]), "j"))

    def checkpoint(self, step: int) -> Path:
        return self.a_root / "jobs" / "j" / "checkpoints" / f"step-{step:010d}.pt"

    def source(self, step: int, files: dict[str, bytes] | None = None) -> Source:
        listed = write_folder(self.checkpoint(step), files or shards(step))
        return Source("a", str(self.checkpoint(step)), manifest_of(step, listed))

    async def copy(self, step: int, files: dict[str, bytes] | None = None) -> bool:
        return await self.ctl.replicator.copy("j", "b", self.source(step, files))

    def holds(self, *steps: int, folder: Path | None = None) -> None:
        """The replica folder holds exactly these steps, each a folder with the source's files
        and its manifest beside it."""
        folder = folder or self.folder
        want = sorted(f"step-{s:010d}.{ext}" for s in steps for ext in ("json", "pt"))
        assert sorted(os.listdir(folder)) == want
        for s in steps:
            replica = folder / f"step-{s:010d}.pt"
            assert replica.is_dir() and tree(replica) == tree(self.checkpoint(s))
            on_disk = msgspec.json.decode(
                (folder / f"step-{s:010d}.json").read_bytes(), type=CheckpointManifest
            )
            assert on_disk.step == s and on_disk.files is not None
            assert {f.path for f in on_disk.files} == {
                k for k, v in tree(replica).items() if v != b"<dir>"
            }

    def failures(self) -> list[Event]:
        return [
            e for e in read(self.ctl.journal.path) if e.kind is Kind.REPLICA and not e.data["ok"]
        ]


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
    await targets.ensure_replica("c")
    bed.holds(200, folder=tmp_path / "c" / "replicas" / "j")
    assert bed.failures() == []
