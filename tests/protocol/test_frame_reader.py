"""FrameReader over a real socketpair: one read takes every frame that has arrived, a frame
split over many reads comes out whole, and its errors are read_message's."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from protocol.errors import ProtocolError
from protocol.framing import (
    EXECUTOR_MESSAGES,
    MAX_FRAME,
    READ_CHUNK,
    FrameBuffer,
    FrameReader,
    encode_frame,
)
from protocol.messages import Heartbeat, Log


def beat(seq: int) -> Heartbeat:
    return Heartbeat(seq=seq, t=float(seq), state="idle", step=seq, epoch=0, clock=float(seq))


class Counted:
    """The real stream reader, with the sizes of what each ``read`` returned written down."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self.reader = reader
        self.reads: list[int] = []

    async def read(self, n: int = -1) -> bytes:
        data = await self.reader.read(n)
        self.reads.append(len(data))
        return data


class Pair:
    def __init__(self, sender: socket.socket, reader: Counted, writer: Any) -> None:
        self.sender = sender
        self.reader = reader
        self._writer = writer

    async def send_bytewise(self, data: bytes) -> None:
        for i in range(len(data)):
            self.sender.sendall(data[i : i + 1])
            await asyncio.sleep(0.0005)  # the reader's task runs between the bytes


@pytest.fixture
async def pair() -> AsyncIterator[Pair]:
    """A connected Unix socketpair: a plain socket to send on, an asyncio reader on the other."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    reader, writer = await asyncio.open_unix_connection(sock=b)
    yield Pair(a, Counted(reader), writer)
    a.close()
    writer.close()


async def drain(frames: FrameReader[Any], timeout: float = 10) -> list[Any]:
    out: list[Any] = []
    while batch := await frames.batch(timeout=timeout):
        out += batch
    return out


async def test_many_frames_in_one_chunk_come_out_in_order_from_few_reads(pair: Pair) -> None:
    msgs = [beat(i) for i in range(2000)]
    data = b"".join(encode_frame(m) for m in msgs)

    def send() -> None:  # from a thread: more than a socket buffer holds (225 KB of 213 KB)
        pair.sender.sendall(data)
        pair.sender.shutdown(socket.SHUT_WR)

    sending = asyncio.create_task(asyncio.to_thread(send))
    frames = FrameReader(pair.reader, EXECUTOR_MESSAGES)
    assert await drain(frames) == msgs
    await sending
    # ~2000 frames, a read per 64 KiB at most (plus the one that sees the end)
    assert len(pair.reader.reads) <= len(data) // (READ_CHUNK // 8) + 2
    assert max(pair.reader.reads) > 1000


async def test_a_frame_split_into_one_byte_reads_comes_out_whole(pair: Pair) -> None:
    msgs = [beat(1), Log(level="info", text="z" * 300), beat(2)]
    data = b"".join(encode_frame(m) for m in msgs)
    frames = FrameReader(pair.reader, EXECUTOR_MESSAGES)
    sending = asyncio.create_task(pair.send_bytewise(data))
    got: list[Any] = []
    while len(got) < len(msgs):
        got += await frames.batch(timeout=10)
    await sending
    assert got == msgs
    assert len(pair.reader.reads) > len(data) // 2  # it did read them in tiny pieces
    pair.sender.shutdown(socket.SHUT_WR)
    assert await frames.batch(timeout=10) == []
    assert await frames.batch(timeout=10) == []  # and stays ended


@pytest.mark.parametrize(
    ("cut", "words"),
    [
        (1, "truncated frame header: 1 of 4 bytes"),
        (3, "truncated frame header: 3 of 4 bytes"),
        (4, "truncated frame: connection closed after 0 of {n} bytes"),
        (9, "truncated frame: connection closed after 5 of {n} bytes"),
    ],
)
async def test_the_end_of_the_stream_inside_a_frame_is_read_messages_error(
    pair: Pair, cut: int, words: str
) -> None:
    frame = encode_frame(beat(7))
    pair.sender.sendall(encode_frame(beat(6)) + frame[:cut])
    pair.sender.shutdown(socket.SHUT_WR)
    frames = FrameReader(pair.reader, EXECUTOR_MESSAGES)
    assert await frames.batch(timeout=10) == [beat(6)]
    with pytest.raises(ProtocolError, match=words.format(n=len(frame) - 4)):
        await frames.batch(timeout=10)


@pytest.mark.parametrize("length", [MAX_FRAME + 1, 2**31])
async def test_an_oversized_length_is_refused_before_its_body(pair: Pair, length: int) -> None:
    """The peer stays open and sends no body: the refusal cannot have waited for one."""
    pair.sender.sendall(length.to_bytes(4, "big"))
    frames = FrameReader(pair.reader, EXECUTOR_MESSAGES)
    t0 = time.monotonic()
    with pytest.raises(ProtocolError, match=f"frame length {length} exceeds the {MAX_FRAME}-byte"):
        await frames.batch(timeout=10)
    assert time.monotonic() - t0 < 5
    assert pair.reader.reads == [4]


async def test_an_oversized_length_arriving_bytewise_is_refused_at_its_fourth_byte(
    pair: Pair,
) -> None:
    frames = FrameReader(pair.reader, EXECUTOR_MESSAGES)
    sending = asyncio.create_task(pair.send_bytewise((MAX_FRAME + 1).to_bytes(4, "big")))
    with pytest.raises(ProtocolError, match="exceeds"):
        await frames.batch(timeout=10)
    await sending
    assert sum(pair.reader.reads) == 4


async def test_a_bad_frame_behind_good_ones_is_raised_next_without_another_read(
    pair: Pair,
) -> None:
    pair.sender.sendall(encode_frame(beat(1)) + (2).to_bytes(4, "big") + b"\xc1\xc1")
    frames = FrameReader(pair.reader, EXECUTOR_MESSAGES)
    assert await frames.batch(timeout=10) == [beat(1)]
    reads = len(pair.reader.reads)
    with pytest.raises(ProtocolError, match="malformed executor->console frame payload"):
        await frames.batch(timeout=10)  # the peer is still open: this must not wait
    assert len(pair.reader.reads) == reads


async def test_next_keeps_what_came_in_the_same_read(pair: Pair) -> None:
    pair.sender.sendall(b"".join(encode_frame(beat(i)) for i in range(3)))
    frames = FrameReader(pair.reader, EXECUTOR_MESSAGES)
    assert await frames.next(timeout=10) == beat(0)
    assert await frames.batch(timeout=10) == [beat(1), beat(2)]
    pair.sender.shutdown(socket.SHUT_WR)
    assert await frames.next(timeout=10) is None


async def test_the_timeout_is_kept_silent_and_mid_frame(pair: Pair) -> None:
    frames = FrameReader(pair.reader, EXECUTOR_MESSAGES)
    t0 = time.monotonic()
    with pytest.raises(ProtocolError, match=r"timed out after 0.2s waiting for a frame"):
        await frames.batch(timeout=0.2)
    assert 0.15 < time.monotonic() - t0 < 3
    pair.sender.sendall(encode_frame(beat(1))[:7])
    with pytest.raises(ProtocolError, match=r"timed out after 0.2s waiting for a frame"):
        await frames.batch(timeout=0.2)


def test_frame_buffer_takes_a_large_frame_in_small_pieces_without_quadratic_copying() -> None:
    """A 4 MiB frame fed 4 KiB at a time: buffered as it comes, decoded once, in order."""
    big = Log(level="info", text="q" * (MAX_FRAME - 64))
    data = encode_frame(beat(1)) + encode_frame(big) + encode_frame(beat(2))
    buf = FrameBuffer(EXECUTOR_MESSAGES)
    out: list[Any] = []
    t0 = time.process_time()
    for i in range(0, len(data), 4096):
        out += buf.feed(data[i : i + 4096])
    buf.close()
    assert out == [beat(1), big, beat(2)]
    # copying what is buffered on every piece would move ~2 GiB here
    assert time.process_time() - t0 < 2
