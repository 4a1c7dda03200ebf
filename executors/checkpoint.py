"""Async, verified checkpoints in one folder.

The step loop pauses only to copy state into CPU memory (``save``); one named thread
writes it to a temp file while hashing, fsyncs and renames it, then writes the
manifest, which marks the checkpoint complete. Loading checks size and sha256 of the
bytes it then deserialises with ``weights_only=True``; a bad checkpoint is skipped for
the previous one, and the skip is an event.

A checkpoint is published (renamed into place with its manifest) only inside the writer's
lease: ``publish`` is the one place that does it, for this module and the command kind.
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import stat
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import msgspec
import torch

from executors.durable import fsync_dir
from protocol.faults import FaultKind
from protocol.messages import CheckpointSaved, ExecutorMessage, Fault
from protocol.spec import CheckpointManifest

Emit = Callable[[ExecutorMessage], None]
LeaseCheck = Callable[[float], bool]
"""``Control.lease_valid``: is there more than this margin (seconds) left of the lease?"""
_READ_CHUNK = 8 << 20
MAX_MANIFEST = 1 << 20
PUBLISH_MARGIN_S = 0.25
"""A checkpoint is published only with more than this left of the lease. The check and the two
renames after it take microseconds; the margin covers a writer descheduled between them (the
GIL handed to the step loop, a loaded host) so that a publish is rarely undone by the check
after the renames, and it is far below the trainer's own guard (a fifth of the lease or more),
so a writer in good time is never refused."""
_PUBLISHING = threading.Lock()
"""Held across each publish's check, renames and check again; the lease watchdog takes it for
good (``seal``) before it ends the process, so the process never ends between the two checks."""


def _always(_margin_s: float) -> bool:
    return True


class Fenced(Exception):
    """The lease ended (or was within ``PUBLISH_MARGIN_S`` of its end): nothing was published."""


def publish(
    data_tmp: Path, data_path: Path, manifest: CheckpointManifest, lease_valid: LeaseCheck
) -> Path:
    """Rename a written, fsynced data file into place and write its manifest, inside the lease.

    Everything slow (the manifest's bytes and fsync) happens before the lease check, so only
    two renames follow it. The lease is checked again after them: if it still holds, the
    renames surely happened before it ended (a lapsed lease is never renewed); if not, both
    files are removed before anything reports them, and ``Fenced`` is raised. Returns the
    manifest's path.
    """
    folder = data_path.parent
    manifest_path = data_path.with_suffix(".json")
    manifest_tmp = folder / f".{manifest_path.name}.tmp"
    try:
        with open(manifest_tmp, "wb") as f:
            f.write(msgspec.json.encode(manifest))
            f.flush()
            os.fsync(f.fileno())
        with _PUBLISHING:
            if not lease_valid(PUBLISH_MARGIN_S):
                raise Fenced(f"checkpoint {manifest.step} not published: the lease is ending")
            os.replace(data_tmp, data_path)
            os.replace(manifest_tmp, manifest_path)
            if not lease_valid(0.0):
                manifest_path.unlink(missing_ok=True)
                data_path.unlink(missing_ok=True)
                raise Fenced(
                    f"checkpoint {manifest.step} withdrawn: the lease ended while it was published"
                )
    except BaseException:
        data_tmp.unlink(missing_ok=True)
        manifest_tmp.unlink(missing_ok=True)
        raise
    fsync_dir(folder)
    return manifest_path


def seal(timeout_s: float = 1.0) -> bool:
    """Publish nothing more in this process: take the publish lock and keep it.

    Called by the lease watchdog just before it ends the process; waits at most
    ``timeout_s`` for a publish in flight. False if it did not get the lock in time.
    """
    return _PUBLISHING.acquire(timeout=timeout_s)


class CorruptCheckpoint(Exception):
    """A checkpoint that must not be loaded; the message says why."""


@dataclass(frozen=True)
class Loaded:
    manifest: CheckpointManifest
    path: Path
    state: dict[str, Any]


def checkpoint_name(step: int) -> str:
    return f"step-{step:010d}"


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


def snapshot(obj: Any) -> Any:
    """A CPU copy of a state tree, so training can go on while it is written."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: snapshot(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [snapshot(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(snapshot(v) for v in obj)
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
        lease_valid: LeaseCheck = _always,
    ) -> None:
        self.folder = folder
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
        folder.mkdir(parents=True, exist_ok=True)
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

    def wait(self) -> CheckpointSaved | None:
        """Block until the write in flight (if any) is done; its result, None if it failed."""
        fut, self._pending = self._pending, None
        return fut.result() if fut is not None else None

    def close(self) -> None:
        self.wait()
        self._pool.shutdown(wait=True)

    def _write(self, step: int, snap: dict[str, Any], stall: float) -> CheckpointSaved | None:
        t0 = time.perf_counter()
        name = checkpoint_name(step)
        data_path = self.folder / f"{name}.pt"
        tmp = self.folder / f".{name}.pt.tmp"
        try:
            with open(tmp, "wb") as f:
                writer = _HashingWriter(f, self._delay)
                torch.save(snap, writer)
                f.flush()
                os.fsync(f.fileno())
            manifest = CheckpointManifest(
                job=self.job,
                step=step,
                file=data_path.name,
                size=writer.size,
                sha256=writer.sha.hexdigest(),
                epoch=self.epoch,
                spec_hash=self.spec_hash,
                code_version=self.code_version,
                created_at=time.time(),
            )
            manifest_path = publish(tmp, data_path, manifest, self._lease_valid)
        except Fenced as e:
            self._emit(Fault(fault=FaultKind.LEASE_LOST.value, step=step, message=str(e)))
            return None
        except (OSError, RuntimeError) as e:  # torch's writer wraps an OSError in a RuntimeError
            tmp.unlink(missing_ok=True)
            self.consecutive_failures += 1
            self._write_failed(step, e)
            return None
        self.consecutive_failures = 0
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
                    fault=FaultKind.DISK_FULL.value,
                    step=step,
                    message=f"no space left writing checkpoint {step} in {self.folder}; kept only the newest",
                )
            )
        else:
            self._emit(
                Fault(
                    fault=FaultKind.CHECKPOINT_WRITE.value,
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
            tmp.unlink(missing_ok=True)
        for data in self.folder.glob("step-*.pt"):
            if not data.with_suffix(".json").exists():
                data.unlink(missing_ok=True)

    def _purge(self, keep: int) -> None:
        for manifest_path in self.manifests()[keep:]:
            manifest_path.unlink(missing_ok=True)
            manifest_path.with_suffix(".pt").unlink(missing_ok=True)
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
                    Fault(
                        fault=kind.value, message=f"skipped {manifest_path.with_suffix('.pt')}: {e}"
                    )
                )
                continue
            return Loaded(manifest, manifest_path.with_suffix(".pt"), state)
        return None

    def _load(
        self, manifest_path: Path, map_location: torch.device | str
    ) -> tuple[CheckpointManifest, dict[str, Any]]:
        manifest = read_manifest(manifest_path)
        if manifest.spec_hash != self.spec_hash:
            raise CorruptCheckpoint(
                f"written for another spec (hash {manifest.spec_hash}, this job {self.spec_hash})"
            )
        if manifest.epoch > self.epoch:
            raise CorruptCheckpoint(
                f"written under epoch {manifest.epoch}, newer than this executor's {self.epoch}"
            )
        data = verified_bytes(manifest_path.with_suffix(".pt"), manifest)
        try:
            buf = io.BytesIO(data)
            state = torch.load(buf, map_location=map_location, weights_only=True)
        except Exception as e:  # noqa: BLE001 - any unpickling failure means "do not use this one"
            text = " ".join(str(e).split())  # torch's errors span lines; an event is one
            text = text if len(text) <= 500 else f"{text[:497]}..."
            raise CorruptCheckpoint(f"does not load: {type(e).__name__}: {text}") from None
        return manifest, state


def _root_errno(e: BaseException | None) -> int | None:
    while e is not None:
        if isinstance(e, OSError) and e.errno is not None:
            return e.errno
        e = e.__cause__ or e.__context__
    return None


def read_manifest(path: Path) -> CheckpointManifest:
    """A manifest from a regular file of at most MAX_MANIFEST bytes, else CorruptCheckpoint."""
    try:
        with open_regular(path) as f:
            raw = f.read(MAX_MANIFEST + 1)
        if len(raw) > MAX_MANIFEST:
            raise CorruptCheckpoint(f"manifest over {MAX_MANIFEST} bytes")
        return msgspec.json.decode(raw, type=CheckpointManifest)
    except (OSError, msgspec.DecodeError) as e:
        raise CorruptCheckpoint(f"unreadable manifest: {e}") from None


def open_regular(path: Path) -> BinaryIO:
    """Open a regular file for reading; a FIFO, device or folder is refused, never waited on."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise CorruptCheckpoint(f"{path.name} is not a regular file")
    return os.fdopen(fd, "rb")


def verified_bytes(path: Path, manifest: CheckpointManifest) -> bytes:
    """The file's bytes, only if their size and sha256 match the manifest."""
    try:
        with open_regular(path) as f:
            size = os.fstat(f.fileno()).st_size
            if size != manifest.size:
                raise CorruptCheckpoint(
                    f"size {size} bytes, manifest says {manifest.size} (truncated?)"
                )
            buf = bytearray()
            sha = hashlib.sha256()
            while len(buf) < size and (chunk := f.read(min(_READ_CHUNK, size - len(buf)))):
                sha.update(chunk)
                buf += chunk
    except OSError as e:
        raise CorruptCheckpoint(f"cannot read: {e}") from None
    if sha.hexdigest() != manifest.sha256:
        raise CorruptCheckpoint(
            f"sha256 {sha.hexdigest()[:12]}… does not match the manifest's {manifest.sha256[:12]}…"
        )
    return bytes(buf)
