"""Host-to-host checkpoint transfer through the console: streamed, verified, resumable."""

from __future__ import annotations

import hashlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from console.reach.transport.base import CHUNK, TemporaryTransportError
from console.reach.transport.files import TransferCorrupt, get_file, put_file, transfer
from console.reach.transport.local import LocalTransport

SIZE = 20 * CHUNK + 12345


class FlakySource(LocalTransport):
    """A host whose stream drops after ``break_after`` bytes, ``breaks`` times."""

    def __init__(self, break_after: int, breaks: int) -> None:
        super().__init__("flaky")
        self.break_after = break_after
        self.breaks = breaks
        self.bytes_read = 0

    async def read_chunks(
        self, path: str, *, offset: int = 0, chunk: int = CHUNK
    ) -> AsyncIterator[bytes]:
        sent = 0
        async for block in super().read_chunks(path, offset=offset, chunk=chunk):
            if self.breaks and sent >= self.break_after:
                self.breaks -= 1
                raise TemporaryTransportError("flaky: connection lost")
            sent += len(block)
            self.bytes_read += len(block)
            yield block


@pytest.fixture
def source_file(tmp_path: Path) -> tuple[Path, str]:
    src = tmp_path / "a" / "ckpt.pt"
    src.parent.mkdir()
    data = os.urandom(SIZE)
    src.write_bytes(data)
    return src, hashlib.sha256(data).hexdigest()


async def test_transfer_is_verified_and_renamed_into_place(
    tmp_path: Path, source_file: tuple[Path, str]
) -> None:
    src, digest = source_file
    dst = tmp_path / "b" / "ckpt.pt"
    dst.parent.mkdir()
    seen: list[tuple[int, int]] = []
    result = await transfer(
        LocalTransport("a"),
        str(src),
        LocalTransport("b"),
        str(dst),
        sha256=digest,
        progress=lambda done, total: seen.append((done, total)),
    )
    assert hashlib.sha256(dst.read_bytes()).hexdigest() == digest
    assert not Path(f"{dst}.part").exists()
    assert (result.bytes, result.resumed_from, result.attempts) == (SIZE, 0, 1)
    assert seen[-1] == (SIZE, SIZE)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    assert len(seen) > 10, "progress is reported as the stream goes"


async def test_a_wrong_hash_is_refused_and_leaves_nothing(
    tmp_path: Path, source_file: tuple[Path, str]
) -> None:
    src, _ = source_file
    dst = tmp_path / "b" / "ckpt.pt"
    dst.parent.mkdir()
    with pytest.raises(TransferCorrupt, match="does not match"):
        await transfer(
            LocalTransport("a"), str(src), LocalTransport("b"), str(dst), sha256="0" * 64
        )
    assert list(dst.parent.iterdir()) == []


async def test_a_dropped_stream_resumes_within_one_transfer(
    tmp_path: Path, source_file: tuple[Path, str]
) -> None:
    src, digest = source_file
    dst = tmp_path / "b" / "ckpt.pt"
    dst.parent.mkdir()
    flaky = FlakySource(break_after=7 * CHUNK, breaks=2)
    result = await transfer(flaky, str(src), LocalTransport("b"), str(dst), sha256=digest)
    assert result.attempts == 3
    assert hashlib.sha256(dst.read_bytes()).hexdigest() == digest
    assert flaky.bytes_read == SIZE, (
        "each retry resumed where the last stopped; nothing was sent twice"
    )


async def test_a_broken_transfer_resumes_from_the_part_on_the_next_call(
    tmp_path: Path, source_file: tuple[Path, str]
) -> None:
    src, digest = source_file
    dst = tmp_path / "b" / "ckpt.pt"
    dst.parent.mkdir()
    with pytest.raises(TemporaryTransportError):
        await transfer(
            FlakySource(break_after=5 * CHUNK, breaks=1),
            str(src),
            LocalTransport("b"),
            str(dst),
            sha256=digest,
            attempts=1,
        )
    part = Path(f"{dst}.part")
    assert part.stat().st_size == 5 * CHUNK
    assert not dst.exists(), "nothing half-written is in place"
    again = FlakySource(break_after=0, breaks=0)
    result = await transfer(again, str(src), LocalTransport("b"), str(dst), sha256=digest)
    assert result.resumed_from == 5 * CHUNK
    assert again.bytes_read == SIZE - 5 * CHUNK
    assert hashlib.sha256(dst.read_bytes()).hexdigest() == digest


async def test_put_and_get_stream_a_file(tmp_path: Path, source_file: tuple[Path, str]) -> None:
    src, digest = source_file
    host = LocalTransport("h")
    remote = tmp_path / "host" / "f"
    remote.parent.mkdir()
    await put_file(host, str(src), str(remote))
    assert await host.sha256(str(remote)) == digest
    back = tmp_path / "back"
    await get_file(host, str(remote), str(back))
    assert hashlib.sha256(back.read_bytes()).hexdigest() == digest
