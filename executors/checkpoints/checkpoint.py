"""Async, verified checkpoints in one folder.

The step loop pauses only to copy state into CPU memory (``save``); one named thread
writes it to a temp file while hashing, fsyncs and renames it, then writes the
manifest, which marks the checkpoint complete. Loading checks size and sha256 of the
bytes it then deserialises with ``weights_only=True``; a bad checkpoint is skipped for
the previous one, and the skip is an event.

A checkpoint is published (renamed into place with its manifest) only inside the writer's
lease: ``publish`` (executors.fencing.publish, which imports no torch) is the one place that does it.
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any, BinaryIO, cast

import torch

from executors.checkpoints.lineage import bare, descend
from executors.durable import fsync_dir
from executors.fencing.publish import (
    PUBLISH_MARGIN_S,
    CorruptCheckpoint,
    Emit,
    Fenced,
    LeaseCheck,
    Loaded,
    always_valid,
    checkpoint_name,
    discard,
    publish,
    read_manifest,
    verified_bytes,
)
from executors.kinds.command.command_tree import tree_digest
from protocol.faults import FaultKind
from protocol.messages import CheckpointSaved, Fault, Log, LogLevel
from protocol.spec import CheckpointManifest, FolderFile, Lineage

__all__ = [
    "PUBLISH_MARGIN_S",
    "CheckpointManager",
    "CorruptCheckpoint",
    "Emit",
    "Fenced",
    "LeaseCheck",
    "Loaded",
]


class _HashingWriter:
    """A write-only file object that hashes and counts what passes through it."""

    def __init__(self, f: BinaryIO, delay_s: float = 0.0) -> None:
        self._f = f
        self._delay = delay_s
        self.sha = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        if self._delay:
            time.sleep(self._delay)
        self.sha.update(data)
        self.size += len(data)
        return self._f.write(data)

    def flush(self) -> None:
        self._f.flush()


def snapshot(obj: Any, leaf: Callable[[torch.Tensor], torch.Tensor] | None = None) -> Any:
    """A CPU copy of a state tree, so training can go on while it is written; ``leaf`` copies
    each tensor (a sharded state's: each DTensor's own shard)."""
    if isinstance(obj, torch.Tensor):
        return leaf(obj) if leaf is not None else obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: snapshot(v, leaf) for k, v in obj.items()}
    if isinstance(obj, list):
        return [snapshot(v, leaf) for v in obj]
    if isinstance(obj, tuple):
        return tuple(snapshot(v, leaf) for v in obj)
    return obj


class CheckpointManager:
    """One job's checkpoints in ``folder``: save (async), wait, load the newest good one, retain K."""

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
        write_delay_s: float = 0.0,
        lease_valid: LeaseCheck = always_valid,
        node_rank: int | None = None,
        nnodes: int = 1,
        any_shard: bool = False,
        lineage: Lineage | None = None,
        publishes: bool = True,
        load_tag: str = "",
    ) -> None:
        self.folder = folder
        self.publishes = publishes
        """False for a host's follower rank (``executors.kinds.torch.local_ranks``): it writes its
        files of a sharded step into local rank 0's, publishes nothing and removes nothing."""
        self._load_tag = load_tag
        """Told apart the folders that ranks sharing this folder load a sharded step in."""
        self.node_rank = node_rank
        """A multi-host job's member: its shards say so, and only its own shards load."""
        self.nnodes = nnodes
        self.any_shard = any_shard
        """An elastic job's member: its members' shards are interchangeable (the model and the
        optimizer are replicated, the data position is global), so a shard of any node rank at
        any group size loads; the checksum, spec and epoch checks stay."""
        self._lease_valid = lease_valid
        self.job = job
        self.spec_hash = spec_hash
        self.keep = keep
        self.epoch = epoch
        self.code_version = code_version
        self._emit = emit
        self._delay = write_delay_s
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hotspare-ckpt")
        self._pending: Future[CheckpointSaved | None] | None = None
        self.last_saved: CheckpointSaved | None = None
        self.consecutive_failures = 0
        self.last_write_s = 0.0
        self.lineage = lineage or bare()
        """This start's lineage (``executors.checkpoints.lineage.at_start``); each manifest adds its parent."""
        self._parent: CheckpointManifest | None = None
        """What the next checkpoint descends from: the one loaded, then each one written."""
        folder.mkdir(parents=True, exist_ok=True)
        if publishes:
            self._remove_incomplete()

    # ------------------------------------------------------------------ saving

    def save(self, step: int, state: dict[str, Any]) -> float:
        """Snapshot ``state`` and queue its write; returns the step-loop stall in seconds."""
        t0 = time.perf_counter()
        self.wait()
        snap = snapshot(state)
        stall = time.perf_counter() - t0
        self._pending = self._pool.submit(self._write, step, snap, stall)
        return stall

    def save_part(
        self,
        step: int,
        state: dict[str, Any],
        trainer: dict[str, Any],
        group: Any,
        *,
        procs: int = 1,
    ) -> float:
        """A sharded job's part of ``step`` (``executors.kinds.torch.sharded``): ``state`` (DTensors) and
        ``trainer`` snapshotted, then written by DCP in the writer thread, its collectives over
        ``group`` (every rank saves the same steps, in order; ``procs`` ranks per host write
        into one folder). Returns the step-loop stall."""
        from torch.distributed.checkpoint.api import CheckpointException

        from executors.kinds.torch import (
            sharded,  # torch.distributed's checkpointing: only sharded jobs
        )

        t0 = time.perf_counter()
        self.wait()
        snap, plain = snapshot(state, sharded.copy_shard), snapshot(trainer)
        stall = time.perf_counter() - t0

        def write(tmp: Path) -> tuple[int, str, list[FolderFile] | None]:
            try:
                files = sharded.save_part(tmp, snap, plain, group=group, procs=procs)
            except CheckpointException as e:  # DCP's: a BaseException; any rank's failure
                raise RuntimeError(f"DCP: {' '.join(str(e).split())[:500]}") from None
            return sum(f.size for f in files), tree_digest(files), files

        self._pending = self._pool.submit(self._write_with, step, write, stall)
        return stall

    def wait(self) -> CheckpointSaved | None:
        """Block until the write in flight (if any) is done; its result, None if it failed."""
        fut, self._pending = self._pending, None
        return fut.result() if fut is not None else None

    def close(self) -> None:
        self.wait()
        self._pool.shutdown(wait=True)

    def _write(self, step: int, snap: dict[str, Any], stall: float) -> CheckpointSaved | None:
        def write(tmp: Path) -> tuple[int, str, list[FolderFile] | None]:
            with open(tmp, "wb") as f:
                writer = _HashingWriter(f, self._delay)
                torch.save(snap, cast(IO[bytes], writer))  # it has write(), all save uses
                f.flush()
                os.fsync(f.fileno())
            return writer.size, writer.sha.hexdigest(), None

        return self._write_with(step, write, stall)

    def _write_with(
        self,
        step: int,
        write: Callable[[Path], tuple[int, str, list[FolderFile] | None]],
        stall: float,
    ) -> CheckpointSaved | None:
        """Write a checkpoint with ``write`` (into the temp path it is given: a file, or a
        folder with its files), then publish it inside the lease, emit it and prune."""
        t0 = time.perf_counter()
        name = checkpoint_name(step)
        data_path = self.folder / f"{name}.pt"
        tmp = self.folder / f".{name}.pt.tmp"
        if not self.publishes:  # a follower's files, in local rank 0's folder: it publishes
            try:
                write(tmp)
            except (OSError, RuntimeError) as e:  # every rank's DCP fails alike: rank 0 says
                self._emit(Log(level=LogLevel.WARNING, text=f"writing step {step}: {e}"))
            return None
        try:
            size, sha, files = write(tmp)
            manifest = CheckpointManifest(
                job=self.job,
                step=step,
                file=data_path.name,
                size=size,
                sha256=sha,
                files=files,
                epoch=self.epoch,
                spec_hash=self.spec_hash,
                code_version=self.code_version,
                created_at=time.time(),
                node_rank=self.node_rank,
                nnodes=self.nnodes,
                lineage=descend(self.lineage, self._parent),
            )
            manifest_path = publish(tmp, data_path, manifest, self._lease_valid)
        except Fenced as e:
            self._emit(Fault(fault=FaultKind.LEASE_LOST, step=step, message=str(e)))
            return None
        except (OSError, RuntimeError) as e:  # torch's writer wraps an OSError in a RuntimeError
            discard(tmp)
            self.consecutive_failures += 1
            self._write_failed(step, e)
            return None
        self.consecutive_failures = 0
        self._parent = manifest
        self.last_write_s = time.perf_counter() - t0
        saved = CheckpointSaved(
            manifest=manifest,
            path=str(data_path),
            manifest_path=str(manifest_path),
            write_s=self.last_write_s,
            stall_s=stall,
        )
        self.last_saved = saved
        self._emit(saved)
        if self._lease_valid(0.0):  # a stale writer deletes nothing either
            self._purge(self.keep)
        return saved

    def _write_failed(self, step: int, e: BaseException) -> None:
        if _root_errno(e) == errno.ENOSPC:
            self._purge(1)
            self._emit(
                Fault(
                    fault=FaultKind.DISK_FULL,
                    step=step,
                    message=f"no space left writing checkpoint {step} in {self.folder}; kept only the newest",
                )
            )
        else:
            self._emit(
                Fault(
                    fault=FaultKind.CHECKPOINT_WRITE,
                    step=step,
                    message=f"writing checkpoint {step} in {self.folder} failed: {e}",
                )
            )

    # ---------------------------------------------------------------- listing

    def manifests(self) -> list[Path]:
        """Manifest paths, newest step first."""
        return sorted(self.folder.glob("step-*.json"), reverse=True)

    def _remove_incomplete(self) -> None:
        """Temp files and data files without a manifest are the remains of a killed write."""
        for tmp in self.folder.glob(".*.tmp"):
            discard(tmp)
        for data in self.folder.glob("step-*.pt"):
            if not data.with_suffix(".json").exists():
                discard(data)
        for loading in self.folder.glob(".load-*"):
            discard(loading)

    def drop_above(self, step: int | None) -> list[int]:
        """Remove the checkpoints newer than ``step`` (all of them for None): a multi-host job's
        shards that not every member committed. This run writes those steps again, and left
        here they would never load but would outrank its new ones when old ones are purged."""
        dropped = []
        for manifest_path in self.manifests():
            try:
                found = int(manifest_path.stem.removeprefix("step-"))
            except ValueError:
                continue
            if step is not None and found <= step:
                break
            manifest_path.unlink(missing_ok=True)
            discard(manifest_path.with_suffix(".pt"))
            dropped.append(found)
        if dropped:
            fsync_dir(self.folder)
        return sorted(dropped)

    def _purge(self, keep: int) -> None:
        for manifest_path in self.manifests()[keep:]:
            manifest_path.unlink(missing_ok=True)
            discard(manifest_path.with_suffix(".pt"))
        try:
            fsync_dir(self.folder)
        except OSError:
            pass

    # ---------------------------------------------------------------- loading

    def load_latest(self, map_location: torch.device | str = "cpu") -> Loaded | None:
        """The newest checkpoint that verifies and loads; each one skipped is a Fault event."""
        for manifest_path in self.manifests():
            try:
                manifest, state = self._load(manifest_path, map_location)
            except CorruptCheckpoint as e:
                kind = (
                    FaultKind.CHECKPOINT_MISMATCH
                    if "spec" in str(e) or "epoch" in str(e)
                    else FaultKind.CHECKPOINT_CORRUPT
                )
                self._emit(
                    Fault(fault=kind, message=f"skipped {manifest_path.with_suffix('.pt')}: {e}")
                )
                continue
            self._parent = manifest
            return Loaded(manifest, manifest_path.with_suffix(".pt"), state)
        return None

    def load_step(self, step: int, map_location: torch.device | str = "cpu") -> Loaded:
        """Exactly the checkpoint of ``step`` (a multi-host job's committed step): verified, and
        for a member only its own shard at the same group size (any shard of an elastic job's,
        ``any_shard``); CorruptCheckpoint says why not."""
        manifest_path = self.folder / f"{checkpoint_name(step)}.json"
        if not manifest_path.exists():
            raise CorruptCheckpoint(f"no checkpoint of step {step} in {self.folder}")
        manifest, state = self._load(manifest_path, map_location)
        self._parent = manifest
        return Loaded(manifest, manifest_path.with_suffix(".pt"), state)

    def _load(
        self, manifest_path: Path, map_location: torch.device | str
    ) -> tuple[CheckpointManifest, dict[str, Any]]:
        manifest = read_manifest(manifest_path)
        self._belongs(manifest)
        if manifest.files is not None:
            raise CorruptCheckpoint("a sharded job's part, not a whole checkpoint")
        data = verified_bytes(manifest_path.with_suffix(".pt"), manifest)
        try:
            buf = io.BytesIO(data)
            state = torch.load(buf, map_location=map_location, weights_only=True)
        except Exception as e:  # noqa: BLE001 - any unpickling failure means "do not use this one"
            text = " ".join(str(e).split())  # torch's errors span lines; an event is one
            text = text if len(text) <= 500 else f"{text[:497]}..."
            raise CorruptCheckpoint(f"does not load: {type(e).__name__}: {text}") from None
        return manifest, state

    def load_part(
        self,
        step: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        group: Any,
        map_location: torch.device | str = "cpu",
    ) -> Loaded:
        """A sharded job's committed ``step``, loaded into its sharded model and optimizer (a
        collective: every rank of ``group`` calls it). This rank's part is verified against its
        manifest; the ranks then send each other what each lacks (``sharded.exchange``), so a
        rank whose part is missing or bad still loads where the others make the step whole (an
        elastic job's member; a fixed-size group needs each rank's own part, for its RNG).
        Returns the trainer state; CorruptCheckpoint on every rank alike when it cannot."""
        from executors.kinds.torch import sharded

        manifest_path = self.folder / f"{checkpoint_name(step)}.json"
        data_path = manifest_path.with_suffix(".pt")
        manifest: CheckpointManifest | None = None
        try:
            if not manifest_path.exists():
                raise CorruptCheckpoint(f"no checkpoint of step {step} in {self.folder}")
            manifest = read_manifest(manifest_path)
            self._belongs(manifest)
            if manifest.files is None or manifest.step != step:
                raise CorruptCheckpoint(
                    f"{manifest_path.name} is not a sharded part of step {step}"
                )
            mine = sharded.verify_part(data_path, manifest.files, manifest.size, manifest.sha256)
        except CorruptCheckpoint as e:
            mine = sharded.Inventory({}, str(e))
        if mine.why and mine.files:  # some of its files stand in from the others' copies
            self._emit(
                Fault(
                    fault=FaultKind.CHECKPOINT_CORRUPT,
                    step=step,
                    message=f"in {data_path}: {mine.why}; a member's copy is used instead",
                )
            )
        whole = self.folder / f".load-{checkpoint_name(step)}{self._load_tag}"
        try:
            state = sharded.sharded_state(model, optimizer)
            sharded.exchange(
                mine,
                data_path if mine.files else None,
                whole,
                group=group,
                own_trainer=not self.any_shard,
                state=state,
            )
            trainer = sharded.load_part(
                model, optimizer, state, whole, group=group, map_location=map_location
            )
        finally:
            discard(whole)
        if mine.files and manifest is not None:
            self._parent = manifest
        return Loaded(manifest, data_path, trainer)

    def _belongs(self, manifest: CheckpointManifest) -> None:
        """This job's spec, this epoch or older, this member's own shard (any, elastic)."""
        if (
            self.node_rank is not None
            and not self.any_shard
            # a single host's checkpoint (node rank None) is a group of one's shard 0
            and (manifest.node_rank or 0, manifest.nnodes) != (self.node_rank, self.nnodes)
        ):
            raise CorruptCheckpoint(
                f"the shard of node rank {manifest.node_rank} of {manifest.nnodes}; this member "
                f"is node rank {self.node_rank} of {self.nnodes}"
            )
        if manifest.spec_hash != self.spec_hash:
            raise CorruptCheckpoint(
                f"written for another spec (hash {manifest.spec_hash}, this job {self.spec_hash})"
            )
        if manifest.epoch > self.epoch:
            raise CorruptCheckpoint(
                f"written under epoch {manifest.epoch}, newer than this executor's {self.epoch}"
            )


def _root_errno(e: BaseException | None) -> int | None:
    while e is not None:
        if isinstance(e, OSError) and e.errno is not None:
            return e.errno
        e = e.__cause__ or e.__context__
    return None
