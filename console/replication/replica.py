"""The spare's side of a replica copy: prune, check the room, receive, verify, publish, prune.

Two ways, one set of rules (``replica_rules``). On a host whose calls are cheap (a local
folder) the console makes them one at a time through the transport (``receive_stepwise``).
Over SSH each call was a remote command of its own, a dozen per copy, and that fixed cost
outweighed the bytes of a small checkpoint; there one program (``replica_receiver``), fed
over one channel, does the whole job on the spare (``receive_in_one``): the console sends a
header, the program prunes, measures the disk and answers whether the copy fits; the
console then streams the data, and the program hashes what it writes, renames it into
place, writes the manifest last and prunes again. A copy that does not fit writes nothing;
a failed one leaves no part (except, between the attempts of one copy, the part a resumed
stream continues); an OS error comes back with its errno.

A folder checkpoint (``CheckpointManifest.files``) is a folder on the spare too: its files
travel one after another in path order, each verified by its own sha256, into the folder
``step-N.pt.part``, which is renamed into place before the manifest is written. Its list of
files is checked before anything is written (``replica_rules.check_files``): a path that is
absolute, not normalised or leaves the folder refuses the copy.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno as errno_
import json
import posixpath
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from console.reach.transport.base import (
    DiskUsage,
    PermanentTransportError,
    TemporaryTransportError,
    Transport,
    TransportError,
)
from console.reach.transport.files import TransferCorrupt, transfer
from console.reach.transport.ssh import SshTransport
from console.replication import replica_receiver as receiver
from console.replication import replica_rules as rules
from console.replication.replica_stream import SourceStream
from protocol.spec import CheckpointManifest
from protocol.units import size

ATTEMPTS = 4
"""Tries of one copy whose stream drops; each later one resumes from the part on the spare."""


class UnsafeManifest(PermanentTransportError):
    """A folder checkpoint's list of files names a path outside its folder, or does not add
    up to the manifest's size and sha256; nothing was written."""


class SpareDiskFull(PermanentTransportError):
    """The replica would not fit on the spare with its reserve kept free; nothing was written."""

    def __init__(self, message: str) -> None:
        super().__init__(message, errno=errno_.ENOSPC)


@dataclass(frozen=True)
class ReplicaPlan:
    """One checkpoint's copy into a spare's replica folder."""

    host: str
    """The spare's inventory name, for messages."""
    folder: str
    step: int
    size: int
    sha256: str
    manifest: bytes
    """The manifest file's bytes, written last: the replica is complete once it is in place."""
    replicas_kept: int
    floor: int
    """Bytes that must stay free on the spare (min_free_disk_gb)."""
    python: str
    """The spare's interpreter, for the program that receives over SSH."""
    files: tuple[tuple[str, int, str], ...] | None = None
    """A folder checkpoint's files (path, size, sha256), in path order; None for a file."""

    @property
    def stem(self) -> str:
        return posixpath.join(self.folder, rules.step_stem(self.step))

    def sources(self, src_path: str) -> list[tuple[str, int]]:
        """The source's files (path, size) whose bytes make the stream, in path order."""
        if self.files is None:
            return [(src_path, self.size)]
        return [(posixpath.join(src_path, rel), n) for rel, n, _ in sorted(self.files)]

    def check(self) -> None:
        """UnsafeManifest when the files a folder's manifest lists cannot be written under
        its replica (a host's word is no path to write to)."""
        if self.files is None:
            return
        why = rules.check_files(list(self.files), self.size, self.sha256)
        if why is not None:
            raise UnsafeManifest(f"{self.host}: replica of step {self.step} refused: {why}")


def folder_files(manifest: CheckpointManifest) -> tuple[tuple[str, int, str], ...] | None:
    """What a ReplicaPlan lists of a manifest's folder, in path order; None for a file."""
    if manifest.files is None:
        return None
    return tuple(sorted((f.path, f.size, f.sha256) for f in manifest.files))


@dataclass(frozen=True)
class Received:
    older: list[int]
    """The complete replicas older than this one that stay on the spare, oldest first."""
    resumed_from: int
    attempts: int


Measured = Callable[[DiskUsage], None]
"""Told the spare's disk each time it is measured (before the copy, and after its prune)."""


def _full(plan: ReplicaPlan, disk: DiskUsage, need: int, reserve: int) -> SpareDiskFull:
    return SpareDiskFull(
        f"{plan.host}: disk full: {size(disk.free)} free under {plan.folder}; the replica of "
        f"step {plan.step} needs {size(need)} and {size(reserve)} must stay free"
    )


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def _remove_steps(t: Transport, folder: str, steps: list[int]) -> None:
    for old in steps:
        stem = posixpath.join(folder, rules.step_stem(old))
        await t.remove(stem + ".json")  # the manifest first: never a manifest without data
        await t.remove(stem + ".pt")


async def receive(
    t: Transport, plan: ReplicaPlan, src: Transport, src_path: str, measured: Measured
) -> Received:
    """Copy a checkpoint from ``src`` into ``t``'s replica folder: in one program where ``t``
    is reached over SSH (each call a round trip), else one transport call at a time."""
    if isinstance(t, SshTransport):
        return await receive_in_one(t, plan, src, src_path, measured)
    return await receive_stepwise(t, plan, src, src_path, measured)


async def receive_stepwise(
    t: Transport, plan: ReplicaPlan, src: Transport, src_path: str, measured: Measured
) -> Received:
    """The copy as one transport call after another: for hosts where a call costs a syscall."""
    plan.check()
    await t.connect()
    await t.makedirs(plan.folder)
    complete, leftovers = rules.survey(await t.listdir(plan.folder))
    retire, older = rules.split_older(complete, plan.step, rules.keep_before(plan.replicas_kept))
    for name in leftovers:
        await t.remove(posixpath.join(plan.folder, name))
    await _remove_steps(t, plan.folder, retire)
    disk = await t.disk_usage(plan.folder)
    measured(disk)
    sizes = None if plan.files is None else [n for _, n, _ in plan.files]
    need, reserve = rules.room(plan.size, len(plan.manifest), disk.block, plan.floor, sizes)
    if disk.free < need + reserve:
        raise _full(plan, disk, need, reserve)
    if plan.files is None:
        result = await transfer(src, src_path, t, plan.stem + ".pt", sha256=plan.sha256)
        resumed, attempts = result.resumed_from, result.attempts
    else:
        resumed, attempts = await _transfer_folder(t, plan, src, src_path)
    await t.write_chunks(plan.stem + ".json.part", _once(plan.manifest))
    await t.rename(plan.stem + ".json.part", plan.stem + ".json")
    retire, older = rules.split_older(older, plan.step, rules.keep_after(plan.replicas_kept))
    with contextlib.suppress(TransportError):
        await _remove_steps(t, plan.folder, retire)
        measured(await t.disk_usage(plan.folder))
    return Received(older, resumed, attempts)


async def _transfer_folder(
    t: Transport, plan: ReplicaPlan, src: Transport, src_path: str
) -> tuple[int, int]:
    """A folder's files into ``STEM.pt.part``, each verified, then the folder into place
    (after the manifest and folder of an earlier copy of this step: a rename replaces no
    folder). The bytes resumed and the most attempts one file took."""
    assert plan.files is not None
    part, data = plan.stem + ".pt.part", plan.stem + ".pt"
    await t.makedirs(part)
    resumed, attempts = 0, 1
    for rel, _, sha256 in sorted(plan.files):  # "a" before "a.part": no temp name collides
        dst = posixpath.join(part, rel)
        await t.makedirs(posixpath.dirname(dst))
        result = await transfer(src, posixpath.join(src_path, rel), t, dst, sha256=sha256)
        resumed, attempts = resumed + result.resumed_from, max(attempts, result.attempts)
    if await t.stat(data) is not None:
        await t.remove(plan.stem + ".json")
        await t.remove(data)
    await t.rename(part, data)
    return resumed, attempts


PROGRAM = Path(rules.__file__).read_text() + Path(receiver.__file__).read_text()
"""The receiving program: the rules' own source, then what drives them on the spare."""


def _disk(fields: list[int]) -> DiskUsage:
    free, total, block = fields
    return DiskUsage(free=free, total=total, block=block)


async def receive_in_one(
    t: SshTransport, plan: ReplicaPlan, src: Transport, src_path: str, measured: Measured
) -> Received:
    """The copy as one program on the spare per attempt; a dropped stream is tried again
    (``ATTEMPTS`` in all), resuming from the part the spare kept."""
    plan.check()
    tries = 0
    first: int | None = None
    older: list[int] = []
    async for attempt in AsyncRetrying(
        retry=retry_if_exception_type(TemporaryTransportError),
        stop=stop_after_attempt(ATTEMPTS),
        wait=wait_exponential(multiplier=0.2, max=5),
        reraise=True,
    ):
        with attempt:
            tries += 1
            older, have = await _attempt(t, plan, src, src_path, measured, resume=tries > 1)
            first = have if first is None else first
    return Received(older, first or 0, tries)


async def _attempt(
    t: SshTransport,
    plan: ReplicaPlan,
    src: Transport,
    src_path: str,
    measured: Measured,
    *,
    resume: bool,
) -> tuple[list[int], int]:
    limit = t.default_timeout
    what = f"receive {plan.stem}.pt"
    header = {
        "folder": plan.folder,
        "step": plan.step,
        "size": plan.size,
        "sha256": plan.sha256,
        "manifest": plan.manifest.decode(),
        "kept": plan.replicas_kept,
        "floor": plan.floor,
        "resume": resume,
        "files": None if plan.files is None else [list(f) for f in plan.files],
    }
    argv = [plan.python, "-I", "-S", "-c", PROGRAM, f"{limit:g}"]
    # a fresh copy starts reading the source while the spare checks the room
    stream = None if resume else SourceStream(src, src_path, plan.sources(src_path), 0)
    try:
        async with t.process(argv, what, limit) as proc:
            with t.errors(what, limit):
                proc.stdin.write(json.dumps(header).encode() + b"\n")
            ready = await _reply(t, proc, what, limit)
            if "disk" in ready:
                measured(_disk(ready["disk"]))
            if ready.get("full"):
                raise _full(plan, _disk(ready["disk"]), ready["need"], ready["reserve"])
            if not ready.get("ready"):
                raise _failed(t, what, ready)
            have = int(ready["have"])
            if stream is None or stream.offset != have:
                if stream is not None:
                    await stream.close()
                stream = SourceStream(src, src_path, plan.sources(src_path), have)
            try:
                await _send(t, proc, stream, plan.size, what, limit)
            except TemporaryTransportError:
                done = await _reply(t, proc, what, 1.0, quiet=True)  # did the program stop it?
                if done.get("error"):
                    raise _failed(t, what, done) from None
                raise
            # the program fsyncs, renames and prunes after the last byte
            done = await _reply(t, proc, what, limit + plan.size / (t.tuning.disk_mb_per_s * 1e6))
    finally:
        if stream is not None:
            await stream.close()
    if not done.get("ok"):
        raise _failed(t, what, done)
    if done.get("disk"):
        measured(_disk(done["disk"]))
    return [int(s) for s in done["older"]], have


async def _send(
    t: SshTransport, proc: Any, stream: SourceStream, size: int, what: str, limit: float
) -> None:
    """The source's bytes from the stream's offset to ``size`` into the program, then end of
    input (a source cut short leaves the program the part, for a resume)."""
    sent = stream.offset
    try:
        async with contextlib.aclosing(stream.blocks()) as blocks:
            async for block in blocks:
                block = block[: size - sent]
                with t.errors(what, limit):
                    proc.stdin.write(block)
                    async with asyncio.timeout(limit):
                        await proc.stdin.drain()
                sent += len(block)
                if sent >= size:
                    break
    finally:
        with contextlib.suppress(Exception), t.errors(what, limit):
            proc.stdin.write_eof()
    if sent < size:
        raise PermanentTransportError(
            f"{stream.src.name}: {stream.path}: ended at {sent} of {size} bytes"
        )


async def _reply(
    t: SshTransport, proc: Any, what: str, limit: float, *, quiet: bool = False
) -> dict[str, Any]:
    """The program's next line; its exit (status and stderr) when there is none."""
    line = b""
    try:
        with t.errors(what, limit):
            async with asyncio.timeout(limit):
                line = await proc.stdout.readline()
    except TransportError:
        if not quiet:
            raise
    if line:
        try:
            reply = json.loads(line)
        except ValueError:
            reply = None
        if isinstance(reply, dict):
            return reply
        raise PermanentTransportError(f"{t.name}: {what}: odd output {line[:80]!r}")
    if quiet:
        return {}
    err = b""
    with contextlib.suppress(Exception):
        async with asyncio.timeout(1.0):
            await proc.wait_closed()
            err = await proc.stderr.read()
    if proc.returncode is None:
        raise TemporaryTransportError(f"{t.name}: {what}: connection lost before it finished")
    text = err.decode(errors="replace").strip().splitlines()
    reason = text[-1] if text else f"exit status {proc.returncode}"
    raise PermanentTransportError(f"{t.name}: {what}: {reason}")


def _failed(t: SshTransport, what: str, reply: dict[str, Any]) -> TransportError:
    """What the program said went wrong, as the transport's error kinds."""
    if "error" in reply:
        return PermanentTransportError(
            f"{t.name}: {reply.get('what') or what}: {reply['error']}", errno=reply.get("errno")
        )
    if "short" in reply:
        return TemporaryTransportError(
            f"{t.name}: {what}: the stream ended after {reply['short']} bytes"
        )
    if "corrupt" in reply:
        where = f"{reply['path']}: " if reply.get("path") else ""
        return TransferCorrupt(
            f"{t.name}: {what}: {where}sha256 {str(reply['corrupt'])[:12]}… does not match"
        )
    if "timeout" in reply:
        return TemporaryTransportError(
            f"{t.name}: {reply.get('what') or what}: no input for {reply['timeout']}s"
        )
    return PermanentTransportError(f"{t.name}: {what}: odd answer {json.dumps(reply)[:120]}")
