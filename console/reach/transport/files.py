"""Moving files with a transport: to and from this machine, and host to host through the console.

Always streamed (a chunk at a time, never a whole file in memory). A host-to-host transfer
writes ``DEST.part``, resumes from its size after a dropped connection, checks the sha256 on
the destination host and only then renames it into place.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from console.reach.transport.base import (
    CHUNK,
    PermanentTransportError,
    Progress,
    TemporaryTransportError,
    Transport,
    TransportError,
)


class TransferCorrupt(PermanentTransportError):
    """The bytes that arrived do not hash to what the source's manifest says."""


@dataclass(frozen=True)
class TransferResult:
    bytes: int
    seconds: float
    resumed_from: int
    attempts: int

    @property
    def mb_per_s(self) -> float:
        return self.bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0


@contextlib.contextmanager
def _this_machine(what: str) -> Iterator[None]:
    """An OS error on the console's own disk, as a transport error with its errno."""
    try:
        yield
    except OSError as e:
        raise PermanentTransportError(
            f"this machine: {what}: {e.strerror or e}", errno=e.errno
        ) from None


async def _local_chunks(path: str, progress: Progress | None, total: int) -> AsyncIterator[bytes]:
    done = 0
    with _this_machine(f"read {path}"), open(path, "rb") as f:
        while block := await asyncio.to_thread(f.read, CHUNK):
            done += len(block)
            if progress:
                progress(done, total)
            yield block


async def put_file(
    t: Transport, local: str, remote: str, *, progress: Progress | None = None
) -> None:
    with _this_machine(f"stat {local}"):
        size = os.path.getsize(local)
    await t.write_chunks(remote, _local_chunks(local, progress, size))


async def get_file(
    t: Transport, remote: str, local: str, *, progress: Progress | None = None
) -> None:
    st = await t.stat(remote)
    if st is None:
        raise PermanentTransportError(f"{t.name}: {remote}: no such file")
    done = 0
    with _this_machine(f"write {local}"), open(local, "wb") as f:
        async for block in t.read_chunks(remote):
            await asyncio.to_thread(f.write, block)
            done += len(block)
            if progress:
                progress(done, st.size)
        await asyncio.to_thread(f.flush)
        await asyncio.to_thread(os.fsync, f.fileno())


async def _counted(
    chunks: AsyncIterator[bytes], start: int, total: int, progress: Progress | None
) -> AsyncIterator[bytes]:
    done = start
    async for block in chunks:
        done += len(block)
        if progress:
            progress(done, total)
        yield block


async def transfer(
    src: Transport,
    src_path: str,
    dst: Transport,
    dst_path: str,
    *,
    sha256: str | None = None,
    progress: Progress | None = None,
    attempts: int = 4,
) -> TransferResult:
    """Copy a file host to host; verified at the destination against ``sha256`` when given.

    A dropped connection resumes from what reached ``DEST.part``; a wrong hash removes the
    part and raises ``TransferCorrupt``.
    """
    st = await src.stat(src_path)
    if st is None:
        raise PermanentTransportError(f"{src.name}: {src_path}: no such file")
    total = st.size
    part = f"{dst_path}.part"
    t0 = time.perf_counter()
    first_offset: int | None = None
    tries = 0
    async for attempt in AsyncRetrying(
        retry=retry_if_exception_type(TemporaryTransportError),
        stop=stop_after_attempt(attempts),
        wait=wait_exponential(multiplier=0.2, max=5),
        reraise=True,
    ):
        with attempt:
            tries += 1
            have = await dst.stat(part)
            offset = have.size if have is not None and have.size <= total else 0
            if first_offset is None:
                first_offset = offset
            if offset < total or have is None:  # an empty file is written too
                chunks = _counted(src.read_chunks(src_path, offset=offset), offset, total, progress)
                await dst.write_chunks(part, chunks, offset=offset)
    digest = await dst.sha256(part)
    if sha256 is not None and digest != sha256:
        await dst.remove(part)
        raise TransferCorrupt(
            f"{dst.name}: {dst_path}: sha256 {digest[:12]}… does not match {sha256[:12]}… from {src.name}"
        )
    await dst.rename(part, dst_path)
    return TransferResult(
        bytes=total - (first_offset or 0),
        seconds=time.perf_counter() - t0,
        resumed_from=first_offset or 0,
        attempts=tries,
    )


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK * 4):
            h.update(block)
    return h.hexdigest()


__all__ = [
    "TransferCorrupt",
    "TransferResult",
    "TransportError",
    "get_file",
    "put_file",
    "sha256_file",
    "transfer",
]
