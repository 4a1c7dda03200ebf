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
from typing import TYPE_CHECKING, Any

from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from console.reach import replica_receiver as receiver
from console.reach import replica_rules as rules
from console.reach.transport.base import (
    DiskUsage,
    PermanentTransportError,
    TemporaryTransportError,
    Transport,
    TransportError,
)
from console.reach.transport.files import TransferCorrupt, transfer

if TYPE_CHECKING:
    from console.reach.transport.ssh import SshTransport

ATTEMPTS = 4
"""Tries of one copy whose stream drops; each later one resumes from the part on the spare."""


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

    @property
    def stem(self) -> str:
        return posixpath.join(self.folder, rules.step_stem(self.step))


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
        f"{plan.host}: disk full: {_mb(disk.free)} free under {plan.folder}; the replica of "
        f"step {plan.step} needs {_mb(need)} and {_mb(reserve)} must stay free"
    )


def _mb(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def _remove_steps(t: Transport, folder: str, steps: list[int]) -> None:
    for old in steps:
        stem = posixpath.join(folder, rules.step_stem(old))
        await t.remove(stem + ".json")  # the manifest first: never a manifest without data
        await t.remove(stem + ".pt")


async def receive_stepwise(
    t: Transport, plan: ReplicaPlan, src: Transport, src_path: str, measured: Measured
) -> Received:
    """The copy as one transport call after another: for hosts where a call costs a syscall."""
    await t.connect()
    await t.makedirs(plan.folder)
    complete, leftovers = rules.survey(await t.listdir(plan.folder))
    retire, older = rules.split_older(complete, plan.step, rules.keep_before(plan.replicas_kept))
    for name in leftovers:
        await t.remove(posixpath.join(plan.folder, name))
    await _remove_steps(t, plan.folder, retire)
    disk = await t.disk_usage(plan.folder)
    measured(disk)
    need, reserve = rules.room(plan.size, len(plan.manifest), disk.block, plan.floor)
    if disk.free < need + reserve:
        raise _full(plan, disk, need, reserve)
    result = await transfer(src, src_path, t, plan.stem + ".pt", sha256=plan.sha256)
    await t.write_chunks(plan.stem + ".json.part", _once(plan.manifest))
    await t.rename(plan.stem + ".json.part", plan.stem + ".json")
    retire, older = rules.split_older(older, plan.step, rules.keep_after(plan.replicas_kept))
    with contextlib.suppress(TransportError):
        await _remove_steps(t, plan.folder, retire)
        measured(await t.disk_usage(plan.folder))
    return Received(older, result.resumed_from, result.attempts)


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
    }
    argv = [plan.python, "-I", "-S", "-c", PROGRAM, f"{limit:g}"]
    # a fresh copy starts reading the source while the spare checks the room
    stream = None if resume else _Stream(src, src_path, 0)
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
                stream = _Stream(src, src_path, have)
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


class _Stream:
    """The source's bytes from ``offset``; the first block is asked for at once, so the
    source's command starts while the spare's program gets ready."""

    def __init__(self, src: Transport, path: str, offset: int) -> None:
        self.src, self.path, self.offset = src, path, offset
        self._chunks = src.read_chunks(path, offset=offset)
        self._first = asyncio.create_task(self._next(), name=f"read {src.name}:{path}")

    async def _next(self) -> bytes | None:
        try:
            return await anext(self._chunks)
        except StopAsyncIteration:
            return None

    async def blocks(self) -> AsyncIterator[bytes]:
        first = await self._first
        if first is None:
            return
        yield first
        async for block in self._chunks:
            yield block

    async def close(self) -> None:
        if not self._first.done():
            self._first.cancel()
        await asyncio.wait([self._first])
        if not self._first.cancelled():
            self._first.exception()  # an error nobody read goes with the copy it belonged to
        await self._chunks.aclose()


async def _send(
    t: SshTransport, proc: Any, stream: _Stream, size: int, what: str, limit: float
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
        return TransferCorrupt(
            f"{t.name}: {what}: sha256 {str(reply['corrupt'])[:12]}… does not match"
        )
    if "timeout" in reply:
        return TemporaryTransportError(
            f"{t.name}: {reply.get('what') or what}: no input for {reply['timeout']}s"
        )
    return PermanentTransportError(f"{t.name}: {what}: odd answer {json.dumps(reply)[:120]}")
