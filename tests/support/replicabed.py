"""Replication in tests: folder checkpoints (their files, manifest and tree) and a console that
copies them from a local primary to its spare (``Bed``), and an sshd transport that counts the
commands (exec channels) opened on its host."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Any

import msgspec

from console.controller import Controller
from console.inventory import load
from console.reach.deploy import replica_dir
from console.reach.transport.ssh import SshTransport
from console.records.journal import Event, Kind, read
from console.replication.replicator import Source
from console.supervise.policy import Policy
from protocol.spec import CheckpointManifest, FolderFile
from support.fleetbed import job_table, local_host, write_inventory


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


class Counting(SshTransport):
    """Counts the commands (exec channels) opened on the host."""

    channels = 0

    async def _process(self, command: str, what: str, timeout: float) -> Any:
        self.channels += 1
        return await super()._process(command, what, timeout)
