"""Frames: a 4-byte big-endian length, then one msgpack-encoded message.

The length is checked against ``MAX_FRAME`` before any buffer is allocated. Every
failure is a ``ProtocolError`` with a one-line reason; the caller closes the link.
"""

from __future__ import annotations

import asyncio
import re
import socket
import struct
from typing import Any, Generic, TypeVar

import msgspec

from protocol.errors import ProtocolError
from protocol.messages import (
    PROTOCOL_VERSION,
    ConsoleHello,
    ConsoleMessage,
    ExecutorHello,
    ExecutorMessage,
)

HEADER = struct.Struct(">I")
MAX_FRAME = 4 * 1024 * 1024

T = TypeVar("T")

_encoder = msgspec.msgpack.Encoder()


def encode_frame(msg: Any) -> bytes:
    """One message as a frame."""
    payload = _encoder.encode(msg)
    if len(payload) > MAX_FRAME:
        raise ProtocolError(
            f"message {type(msg).__name__} is {len(payload)} bytes, over the {MAX_FRAME}-byte frame limit"
        )
    return HEADER.pack(len(payload)) + payload


class MessageDecoder(Generic[T]):
    """A typed msgpack decoder for one direction, built once and reused."""

    def __init__(self, union: Any, direction: str) -> None:
        self._decoder = msgspec.msgpack.Decoder(union)
        self.direction = direction

    def decode(self, payload: bytes | memoryview) -> T:
        try:
            return self._decoder.decode(payload)
        except msgspec.ValidationError as e:
            text = str(e)
            if text.endswith("at `$.kind`") or "missing required field `kind`" in text:
                raise ProtocolError(
                    f"unknown {self.direction} message kind: {_one_line(text)}"
                ) from None
            raise ProtocolError(f"invalid {self.direction} message: {_one_line(text)}") from None
        except msgspec.DecodeError as e:
            raise ProtocolError(
                f"malformed {self.direction} frame payload: {_one_line(str(e))}"
            ) from None


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _one_line(text: str, limit: int = 300) -> str:
    """A peer's bytes quoted in an error: control characters escaped, the middle cut if long."""
    text = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
    if len(text) > limit:
        text = f"{text[: limit // 2]}...({len(text) - limit} chars)...{text[-limit // 2 :]}"
    return text


CONSOLE_MESSAGES: MessageDecoder[ConsoleMessage] = MessageDecoder(
    ConsoleMessage, "console->executor"
)
EXECUTOR_MESSAGES: MessageDecoder[ExecutorMessage] = MessageDecoder(
    ExecutorMessage, "executor->console"
)


def check_length(length: int, max_frame: int = MAX_FRAME) -> None:
    if length > max_frame:
        raise ProtocolError(f"frame length {length} exceeds the {max_frame}-byte limit")


class FrameBuffer(Generic[T]):
    """Sans-I/O frame splitter: ``feed`` bytes in any chunking, get whole messages out.

    A bad frame raises ``ProtocolError``. When good frames came before it in the same
    chunk, ``feed`` first returns their messages (as a stream reader would) and the error
    is raised by the next ``feed``, ``check`` or ``close``. A length over the limit is
    refused as soon as its 4 header bytes are in, before any of its body is awaited.
    """

    def __init__(self, decoder: MessageDecoder[T], max_frame: int = MAX_FRAME) -> None:
        self._decoder = decoder
        self._max = max_frame
        self._buf = bytearray()
        """The start of a frame not yet whole (never a whole one: those are decoded at once)."""
        self._need = HEADER.size
        """How many bytes ``_buf`` must hold before parsing it can give something."""
        self._error: ProtocolError | None = None

    def feed(self, data: bytes) -> list[T]:
        if self._error is not None:
            raise self._error
        buf = self._buf
        if buf:
            buf += data
            if len(buf) < self._need:  # a large frame arriving in pieces: no copy, no parse
                return []
            data = bytes(buf)
            buf.clear()
        out: list[T] = []
        size = len(data)
        pos = 0
        max_frame = self._max
        decode = self._decoder.decode
        view = memoryview(data)
        try:
            while size - pos >= HEADER.size:
                (length,) = HEADER.unpack_from(data, pos)
                if length > max_frame:
                    check_length(length, max_frame)
                end = pos + HEADER.size + length
                if end > size:
                    self._need = end - pos
                    break
                out.append(decode(view[pos + HEADER.size : end]))
                pos = end
            else:
                self._need = HEADER.size
            if pos < size:
                buf += view[pos:]
        except ProtocolError as e:
            self._error = e
            buf.clear()
            if not out:
                raise
        return out

    def check(self) -> None:
        """Raise the error of a bad frame that ``feed`` held back behind good ones, if any."""
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        """End of stream: bytes of a partial frame still buffered mean a truncated frame."""
        if self._error is not None:
            raise self._error
        if self._buf:
            raise ProtocolError(
                f"connection closed inside a frame ({len(self._buf)} bytes of a partial frame)"
            )

    def truncated(self) -> ProtocolError | None:
        """What the stream ending here cuts short, in ``read_message``'s words; None at a
        frame boundary."""
        got = len(self._buf)
        if not got:
            return None
        if got < HEADER.size:
            return ProtocolError(f"truncated frame header: {got} of {HEADER.size} bytes")
        (length,) = HEADER.unpack_from(self._buf)
        return ProtocolError(
            f"truncated frame: connection closed after {got - HEADER.size} of {length} bytes"
        )


# ------------------------------------------------------------------------ blocking


def _recv_exact(sock: socket.socket, n: int, *, at_boundary: bool) -> bytes | None:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        try:
            k = sock.recv_into(view[got:], n - got)
        except TimeoutError:
            raise ProtocolError(f"timed out reading a frame ({got} of {n} bytes)") from None
        if k == 0:
            if got == 0 and at_boundary:
                return None
            raise ProtocolError(f"truncated frame: connection closed after {got} of {n} bytes")
        got += k
    return bytes(buf)


def recv_message(
    sock: socket.socket, decoder: MessageDecoder[T], max_frame: int = MAX_FRAME
) -> T | None:
    """Read one message from a blocking socket (its own timeout applies); None on a clean close."""
    header = _recv_exact(sock, HEADER.size, at_boundary=True)
    if header is None:
        return None
    (length,) = HEADER.unpack(header)
    check_length(length, max_frame)
    payload = _recv_exact(sock, length, at_boundary=False)
    assert payload is not None
    return decoder.decode(payload)


def send_message(sock: socket.socket, msg: Any) -> None:
    sock.sendall(encode_frame(msg))


# ------------------------------------------------------------------------- asyncio


async def read_message(
    reader: asyncio.StreamReader,
    decoder: MessageDecoder[T],
    *,
    timeout: float | None = None,
    max_frame: int = MAX_FRAME,
) -> T | None:
    """Read one message; None on a clean close at a frame boundary."""
    try:
        async with asyncio.timeout(timeout):
            try:
                header = await reader.readexactly(HEADER.size)
            except asyncio.IncompleteReadError as e:
                if not e.partial:
                    return None
                raise ProtocolError(
                    f"truncated frame header: {len(e.partial)} of {HEADER.size} bytes"
                ) from None
            (length,) = HEADER.unpack(header)
            check_length(length, max_frame)
            try:
                payload = await reader.readexactly(length)
            except asyncio.IncompleteReadError as e:
                raise ProtocolError(
                    f"truncated frame: connection closed after {len(e.partial)} of {length} bytes"
                ) from None
    except TimeoutError:
        raise ProtocolError(f"timed out after {timeout:g}s waiting for a frame") from None
    return decoder.decode(payload)


READ_CHUNK = 64 * 1024
"""The most one read of a :class:`FrameReader` asks its stream for."""


class FrameReader(Generic[T]):
    """The messages of a stream, read a chunk at a time.

    One ``read`` takes whatever has arrived (up to ``chunk`` bytes), however many frames
    that is, into a :class:`FrameBuffer`; ``read_message`` makes two ``readexactly`` calls
    per frame, and over asyncssh each takes the channel's read lock. The errors are
    ``read_message``'s: a clean end at a frame boundary is ``[]``, an end inside a frame,
    a length over the limit (before its body is awaited), a malformed or unknown message,
    a timeout are each a ``ProtocolError`` with the same words.
    """

    def __init__(
        self,
        reader: Any,
        decoder: MessageDecoder[T],
        *,
        max_frame: int = MAX_FRAME,
        chunk: int = READ_CHUNK,
    ) -> None:
        self._reader = reader
        """Anything with ``async read(n) -> bytes`` (b"" at EOF): an asyncio StreamReader,
        an asyncssh SSHReader."""
        self._frames: FrameBuffer[T] = FrameBuffer(decoder, max_frame)
        self._chunk = chunk
        self._ready: list[T] = []
        self._ended = False

    async def batch(self, timeout: float | None = None) -> list[T]:
        """Every message decoded and not yet handed out, in order, reading until there is at
        least one; ``[]`` once the stream has ended at a frame boundary. ``timeout`` bounds
        the wait for the first whole frame, like ``read_message``'s."""
        if self._ready:
            out, self._ready = self._ready, []
            return out
        self._frames.check()  # a bad frame behind the good ones handed out last time
        if self._ended:
            return []
        if timeout is None:
            return await self._read()
        try:
            async with asyncio.timeout(timeout):
                return await self._read()
        except TimeoutError:
            raise ProtocolError(f"timed out after {timeout:g}s waiting for a frame") from None

    async def next(self, timeout: float | None = None) -> T | None:
        """One message (those decoded with it are kept for later); None on a clean close."""
        if not self._ready:
            self._ready = await self.batch(timeout)
            if not self._ready:
                return None
        return self._ready.pop(0)

    async def _read(self) -> list[T]:
        read, chunk, feed = self._reader.read, self._chunk, self._frames.feed
        while True:
            data = await read(chunk)
            if not data:
                self._ended = True
                self._frames.check()
                error = self._frames.truncated()
                if error is not None:
                    raise error
                return []
            out = feed(data)
            if out:
                return out


async def write_message(writer: asyncio.StreamWriter, msg: Any, *, timeout: float = 10.0) -> None:
    writer.write(encode_frame(msg))
    async with asyncio.timeout(timeout):
        await writer.drain()


def check_hello(msg: Any, expected: type) -> None:
    """The first frame must be the peer's Hello with our protocol version."""
    if not isinstance(msg, expected):
        raise ProtocolError(
            f"expected {expected.__name__} as the first frame, got {type(msg).__name__}"
        )
    assert isinstance(msg, (ConsoleHello, ExecutorHello))
    if msg.version != PROTOCOL_VERSION:
        raise ProtocolError(
            f"peer speaks protocol version {msg.version}, this side speaks {PROTOCOL_VERSION}"
        )
