"""Publishing a checkpoint inside the writer's lease, and reading one back verified; no torch.

A checkpoint is published (renamed into place with its manifest) only inside the writer's
lease: ``publish`` is the one place that does it, for the torch kind and the command kind.
``seal`` ends publishing for the process (the lease watchdog, before it ends the process).

The reader refuses what the writer could not confirm: a publish first leaves a marker
(``.step-N.pending``) and removes it only once the lease is seen to hold after the renames. A
writer that never got there (killed, frozen past its lease, its process ended by the watchdog
while a rename on slow storage hung) leaves the marker, and ``read_manifest`` refuses that
checkpoint for good however whole its bytes are, as the console's listing does.
This module imports no torch, so the ``command`` kind's executor never pays for it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import msgspec

from executors.checkpoints import verified
from executors.durable import fsync_dir
from executors.fencing.guard import PUBLISH_MARGIN_S
from protocol.errors import HotspareError
from protocol.messages import ExecutorMessage
from protocol.spec import CheckpointManifest

Emit = Callable[[ExecutorMessage], None]
LeaseCheck = Callable[[float], bool]
"""``Control.lease_valid``: is there more than this margin (seconds) left of the lease?"""
_READ_CHUNK = 8 << 20
MAX_MANIFEST = 1 << 20
_PUBLISHING = threading.Lock()
"""Held across each publish's check, renames and check again; the lease watchdog takes it for
good (``seal``) before it ends the process, so the process never ends between the two checks."""


def always_valid(_margin_s: float) -> bool:
    return True


class Fenced(HotspareError):
    """The lease ended (or was within ``PUBLISH_MARGIN_S`` of its end): nothing was published."""

    permanent = True


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
    marker = pending_marker(manifest_path)
    try:
        with open(manifest_tmp, "wb") as f:
            f.write(msgspec.json.encode(manifest))
            f.flush()
            os.fsync(f.fileno())
        with open(marker, "wb") as f:
            os.fsync(f.fileno())
        fsync_dir(folder)  # the marker is on disk before anything it guards is
        with _PUBLISHING:
            if not lease_valid(PUBLISH_MARGIN_S):
                marker.unlink()  # it guards nothing: nothing was renamed
                raise Fenced(f"checkpoint {manifest.step} not published: the lease is ending")
            os.replace(data_tmp, data_path)
            os.replace(manifest_tmp, manifest_path)
            if not lease_valid(0.0):
                manifest_path.unlink(missing_ok=True)
                discard(data_path)
                marker.unlink()  # only once what it guards is gone
                raise Fenced(
                    f"checkpoint {manifest.step} withdrawn: the lease ended while it was published"
                )
            marker.unlink()  # confirmed inside the lease
    except BaseException:
        discard(data_tmp)
        manifest_tmp.unlink(missing_ok=True)
        raise
    fsync_dir(folder)
    return manifest_path


def discard(path: Path) -> None:
    """Remove a file, or a folder with what is in it; nothing if it is not there."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def seal(timeout_s: float = 1.0) -> bool:
    """Publish nothing more in this process: take the publish lock and keep it.

    Called by the lease watchdog just before it ends the process; waits at most
    ``timeout_s`` for a publish in flight. False if it did not get the lock in time.
    """
    return _PUBLISHING.acquire(timeout=timeout_s)


class CorruptCheckpoint(HotspareError):
    """A checkpoint that must not be loaded; the message says why."""

    permanent = True


@dataclass(frozen=True)
class Loaded:
    manifest: CheckpointManifest | None
    """None only for a sharded job's member that had no part of the step (sent the others')."""
    path: Path
    state: dict[str, Any]


def checkpoint_name(step: int) -> str:
    return f"step-{step:010d}"


def pending_marker(manifest_path: Path) -> Path:
    """The marker a publish leaves until it is confirmed inside the lease."""
    return manifest_path.with_name(f".{manifest_path.stem}.pending")


def read_manifest(path: Path) -> CheckpointManifest:
    """A manifest from a regular file of at most MAX_MANIFEST bytes whose publish was confirmed
    inside its writer's lease, else CorruptCheckpoint."""
    if pending_marker(path).exists():
        raise CorruptCheckpoint(
            "its publish was never confirmed inside the writer's lease (a stale write)"
        )
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


def verified_bytes(path: Path, manifest: CheckpointManifest, *, ahead: bool = False) -> bytes:
    """The file's bytes, only if their size and sha256 match the manifest: read ahead and kept
    (``executors.checkpoints.verified``) while the file has not changed since, else read and hashed now.
    With ``ahead``, the bytes are kept for the load that follows."""
    try:
        with open_regular(path) as f:
            st = os.fstat(f.fileno())
            k = verified.key(str(path), st, manifest.sha256)
            if ahead and verified.holds(k):
                return b""  # already read ahead
            if not ahead and st.st_size == manifest.size and (kept := verified.take(k)):
                return kept
            size = st.st_size
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
    data = bytes(buf)
    if ahead:
        verified.keep(k, data)
    return data


def read_ahead(folder: Path, max_bytes: int) -> int | None:
    """Read and verify the newest checkpoint in ``folder`` for the load that follows Start (an
    idle executor calls this while it waits); its step, or None when there is none, it is over
    ``max_bytes``, or it does not verify (the load will say why)."""
    manifests = sorted(folder.glob("step-*.json"), reverse=True)
    if not manifests:
        return None
    try:
        manifest = read_manifest(manifests[0])
        if manifest.size > max_bytes:
            return None
        verified_bytes(manifests[0].with_suffix(".pt"), manifest, ahead=True)
    except CorruptCheckpoint:
        return None
    return manifest.step
