"""The command kind's checkpoints: their durable copies in the workdir, and the restore at
start.

A command writes checkpoints into its own ``checkpoint_dir``. Only a complete one
(``executors.kinds.command.command_watch``: its marker exists, or it is closed by every process of the run,
or it stayed unchanged for ``settle_s``) is copied into
``WORKDIR/checkpoints/step-N.pt`` (temp file, fsync, rename) with a manifest written last,
exactly like a torch checkpoint, so the console replicates it the same way. At start the
newest manifest there that verifies (size and sha256) is copied back into ``checkpoint_dir``
under the name the command gave it; nothing else matching ``checkpoint_glob`` is left there,
so a half-written file can never be resumed from. A checkpoint may be a folder
(torch.distributed.checkpoint writes one per step): it is judged, copied and restored whole,
and its manifest lists every file in it (``executors.kinds.command.command_tree``).
"""

from __future__ import annotations

import errno
import os
import time
from dataclasses import dataclass
from pathlib import Path

from executors.checkpoints.lineage import bare, descend
from executors.durable import fsync_dir
from executors.fencing.publish import (
    CorruptCheckpoint,
    Emit,
    Fenced,
    LeaseCheck,
    checkpoint_name,
    read_manifest,
)
from executors.kinds.command.command_tree import (
    How,
    put,
    remove,
    restore_file,
    restore_folder,
    stage,
)
from executors.kinds.command.command_watch import Candidate, Watcher, marker_beside, marker_name
from protocol.errors import HotspareError
from protocol.faults import FaultKind
from protocol.messages import CheckpointSaved, Fault, Log, LogLevel
from protocol.spec import CheckpointManifest, CommandSpec, Lineage


class NotCommitted(HotspareError):
    """The step the group committed cannot be restored on this host; the message says why, in
    one line."""

    permanent = True


class _Unusable(HotspareError):
    permanent = True

    def __init__(self, kind: FaultKind, why: str) -> None:
        super().__init__(why)
        self.kind = kind


@dataclass(frozen=True)
class Restored:
    manifest: CheckpointManifest
    path: Path
    """Where the checkpoint now is in the command's ``checkpoint_dir``."""


def how_said(how: How, folder: Path, *, link: bool) -> str:
    """The one line that says how checkpoints reach ``folder`` (and what it costs on disk)."""
    said = f"checkpoints are published into {folder} as "
    if how is How.REFLINK:
        return said + "reflinks of the command's files (copy-on-write: no second copy on disk)"
    if how is How.LINK:
        return said + (
            "hard links of the command's files (no second copy on disk; a file the command "
            "rewrote in place would fail its checksum at restore)"
        )
    why = (
        "neither a reflink nor a hard link"
        if link
        else "no reflink (a file rewritten in place is never hard-linked)"
    )
    return said + f"copies of the command's files (the filesystem here allows {why})"


class Publisher:
    """Durable copies of complete checkpoints in ``WORKDIR/checkpoints``, each with a manifest."""

    def __init__(
        self,
        folder: Path,
        *,
        job: str,
        spec_hash: str,
        keep: int,
        epoch: int,
        code_version: str,
        emit: Emit,
        lease_valid: LeaseCheck | None = None,
        node_rank: int | None = None,
        nnodes: int = 1,
        lineage: Lineage | None = None,
        link: bool = False,
    ) -> None:
        self.folder = folder
        self.link = link
        """Publish by hard link where a reflink is not to be had (files the command writes
        once: never ``checkpoint_file``, which it rewrites in place)."""
        self._how: How | None = None
        """How the last checkpoint was taken: said once, and again when it changes."""
        self.node_rank, self.nnodes = node_rank, nnodes
        """A multi-host job's shard: this host's node rank and the group's size, in each manifest."""
        self._lease_valid: LeaseCheck = lease_valid or (lambda _margin_s: True)
        self.job, self.spec_hash, self.keep, self.epoch = job, spec_hash, keep, epoch
        self.code_version = code_version
        self._emit = emit
        self.last: CheckpointManifest | None = None
        """The newest checkpoint this run holds: the restored one, then each one published."""
        self.lineage = lineage or bare()
        """This start's lineage (``executors.checkpoints.lineage.at_start``); each manifest adds its parent:
        ``last``."""
        folder.mkdir(parents=True, exist_ok=True)
        for tmp in folder.glob(".*.tmp"):
            remove(tmp)
        for data in folder.glob("step-*.pt"):
            if not data.with_suffix(".json").exists():
                remove(data)

    @property
    def step(self) -> int | None:
        return self.last.step if self.last else None

    def publish(self, cand: Candidate) -> CheckpointSaved | None:
        """Copy, verify it did not change meanwhile, publish (renames and manifest, only inside
        the lease: ``checkpoint.publish``), emit, prune."""
        t0 = time.perf_counter()
        name = checkpoint_name(cand.step)
        data_path, tmp = self.folder / f"{name}.pt", self.folder / f".{name}.pt.tmp"
        try:
            staged = stage(cand.path, cand.entries, cand.size, cand.mtime_ns, tmp, link=self.link)
            if staged is None:
                return None  # it changed while copied: not complete after all; judged again later
            size, sha, files = staged.size, staged.sha256, staged.files
            manifest = CheckpointManifest(
                job=self.job,
                step=cand.step,
                file=data_path.name,
                size=size,
                sha256=sha,
                epoch=self.epoch,
                spec_hash=self.spec_hash,
                code_version=self.code_version,
                created_at=time.time(),
                source=cand.path.name,
                node_rank=self.node_rank,
                nnodes=self.nnodes,
                files=files,
                lineage=descend(self.lineage, self.last),
            )
            manifest_path = put(tmp, data_path, manifest, self._lease_valid)
        except Fenced as e:
            self._emit(Fault(fault=FaultKind.LEASE_LOST, step=cand.step, message=str(e)))
            return None
        except CorruptCheckpoint:  # not a regular file: not a checkpoint, whatever its name
            remove(tmp)
            return None
        except OSError as e:
            remove(tmp)
            full = e.errno == errno.ENOSPC
            if full:
                self._purge(1)
            self._emit(
                Fault(
                    fault=(FaultKind.DISK_FULL if full else FaultKind.CHECKPOINT_WRITE),
                    step=cand.step,
                    message=f"copying checkpoint {cand.path} into {self.folder} failed: {e}",
                )
            )
            return None
        self.last = manifest
        if staged.how is not self._how:
            self._how = staged.how
            self._emit(
                Log(level=LogLevel.INFO, text=how_said(staged.how, self.folder, link=self.link))
            )
        saved = CheckpointSaved(
            manifest=manifest,
            path=str(data_path),
            manifest_path=str(manifest_path),
            write_s=time.perf_counter() - t0,
            stall_s=0.0,
        )
        self._emit(saved)
        if self._lease_valid(0.0):  # a stale writer deletes nothing either
            self._purge(self.keep)
        return saved

    def oldest_kept(self) -> int | None:
        """The oldest step published here and still kept."""
        steps = [s for p in self.folder.glob("step-*.json") if (s := _step_of(p)) is not None]
        return min(steps, default=None)

    def _purge(self, keep: int) -> None:
        for manifest_path in sorted(self.folder.glob("step-*.json"), reverse=True)[keep:]:
            manifest_path.unlink(missing_ok=True)
            remove(manifest_path.with_suffix(".pt"))
        try:
            fsync_dir(self.folder)
        except OSError:
            pass

    def restore(self, dest: Path, cs: CommandSpec) -> Restored | None:
        """Put the newest checkpoint that verifies into ``dest``; each one skipped is a Fault."""
        for manifest_path in sorted(self.folder.glob("step-*.json"), reverse=True):
            try:
                return self._restore(manifest_path, dest, cs)
            except _Unusable as e:
                self._skip(e.kind, manifest_path, str(e))
        return None

    def restore_step(self, step: int, dest: Path, cs: CommandSpec) -> Restored:
        """Put exactly the checkpoint of ``step`` (the group's committed step) into ``dest``;
        NotCommitted when it is missing or unusable: no other step will do."""
        manifest_path = self.folder / f"{checkpoint_name(step)}.json"
        if not manifest_path.exists():
            raise NotCommitted(
                f"committed step {step} is not on this host: no {manifest_path.name} in "
                f"{self.folder}; cannot resume the group"
            )
        try:
            restored = self._restore(manifest_path, dest, cs)
        except _Unusable as e:
            raise NotCommitted(f"committed step {step} cannot be restored: {e}") from None
        if restored.manifest.step != step:
            raise NotCommitted(
                f"committed step {step}: {manifest_path.name} names step {restored.manifest.step}"
            )
        return restored

    def drop_after(self, step: int | None) -> list[int]:
        """Remove the checkpoints newer than ``step`` (all of them for None): steps the group
        never committed, which a new run writes again. The steps removed, oldest first."""
        gone = []
        for manifest_path in sorted(self.folder.glob("step-*.json")):
            found = _step_of(manifest_path)
            if found is None or (step is not None and found <= step):
                continue
            manifest_path.unlink(missing_ok=True)
            remove(manifest_path.with_suffix(".pt"))
            gone.append(found)
        if gone:
            fsync_dir(self.folder)
        return gone

    def _restore(self, manifest_path: Path, dest: Path, cs: CommandSpec) -> Restored:
        """Verify one checkpoint and copy it into ``dest``, else _Unusable."""
        try:
            manifest = read_manifest(manifest_path)
        except CorruptCheckpoint as e:
            raise _Unusable(FaultKind.CHECKPOINT_CORRUPT, str(e)) from None
        self._check_belongs(manifest)
        source = manifest.source
        if not source or "/" in source or source.startswith(".") or "\0" in source:
            source = manifest.file
        target, tmp = dest / source, dest / f".{source}.restore.tmp"
        data = manifest_path.with_suffix(".pt")
        try:
            if manifest.files is not None:
                restore_folder(data, tmp, manifest.files, manifest.size, manifest.sha256)
            else:
                restore_file(data, tmp, manifest.size, manifest.sha256)
        except CorruptCheckpoint as e:
            raise _Unusable(FaultKind.CHECKPOINT_CORRUPT, str(e)) from None
        except OSError as e:
            raise _Unusable(FaultKind.CHECKPOINT_CORRUPT, f"cannot read: {e}") from None
        remove(target)
        os.replace(tmp, target)
        marker = cs.complete_marker
        if marker and (manifest.files is None or marker_beside(marker)):
            (dest / marker_name(marker, source)).touch()
        fsync_dir(dest)
        self.last = manifest
        return Restored(manifest, target)

    def _check_belongs(self, manifest: CheckpointManifest) -> None:
        """This job, this epoch or older, this host's shard of a group of this size."""
        mismatch = FaultKind.CHECKPOINT_MISMATCH
        if manifest.spec_hash != self.spec_hash:
            why = f"written for another spec (hash {manifest.spec_hash}, this job {self.spec_hash})"
            raise _Unusable(mismatch, why)
        if manifest.epoch > self.epoch:
            why = f"written under epoch {manifest.epoch}, newer than this executor's {self.epoch}"
            raise _Unusable(mismatch, why)
        if manifest.nnodes != self.nnodes:
            why = f"a shard of a group of {manifest.nnodes} host(s); this group has {self.nnodes}"
            raise _Unusable(mismatch, why)
        if (
            None not in (manifest.node_rank, self.node_rank)
            and manifest.node_rank != self.node_rank
        ):
            why = f"node rank {manifest.node_rank}'s shard; this host is node rank {self.node_rank}"
            raise _Unusable(mismatch, why)

    def _skip(self, kind: FaultKind, manifest_path: Path, why: str) -> None:
        self._emit(Fault(fault=kind, message=f"skipped {manifest_path.with_suffix('.pt')}: {why}"))


def _step_of(manifest_path: Path) -> int | None:
    try:
        return int(manifest_path.stem.removeprefix("step-"))
    except ValueError:
        return None


def clear(folder: Path, cs: CommandSpec, watcher: Watcher) -> int:
    """Remove what a previous run left in the command's folder: checkpoints, markers, temp files
    of restores. The workdir's manifests are the truth; returns how many files went."""
    gone = 0
    for path, _ in watcher.files():
        remove(path)
        gone += 1
        if cs.complete_marker:
            (folder / marker_name(cs.complete_marker, path.name)).unlink(missing_ok=True)
    if cs.complete_marker:  # markers left without their checkpoint
        for mark in folder.glob(marker_name(cs.complete_marker, cs.checkpoint_glob)):
            mark.unlink(missing_ok=True)
    for tmp in folder.glob(".*.restore.tmp"):
        remove(tmp)
    return gone
