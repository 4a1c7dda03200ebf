"""The source's side of a replica copy over SSH: its bytes as one stream, a file's or a folder
checkpoint's files one after another (in the order the spare's program writes them), from any
offset a resumed copy asks for.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator

from console.reach.transport.base import PermanentTransportError, Transport


class SourceStream:
    """The source's bytes from ``offset``: its files' (path, size), one after another, each
    cut at its size; the first block is asked for at once, so the source's command starts
    while the spare's program gets ready."""

    def __init__(
        self, src: Transport, path: str, files: list[tuple[str, int]], offset: int
    ) -> None:
        self.src, self.path, self.offset = src, path, offset
        self._chunks = self._read(files)
        self._first = asyncio.create_task(self._next(), name=f"read {src.name}:{path}")

    async def _read(self, files: list[tuple[str, int]]) -> AsyncGenerator[bytes, None]:
        at = 0
        for path, size in files:
            got, at = max(self.offset - at, 0), at + size
            if got >= size:
                continue
            async with contextlib.aclosing(self.src.read_chunks(path, offset=got)) as chunks:
                async for block in chunks:
                    block = block[: size - got]
                    got += len(block)
                    yield block
                    if got >= size:
                        break
            if got < size:  # the next file's bytes would land in this one's place
                raise PermanentTransportError(
                    f"{self.src.name}: {path}: ended at {got} of {size} bytes"
                )

    async def _next(self) -> bytes | None:
        try:
            return await anext(self._chunks)
        except StopAsyncIteration:
            return None

    async def blocks(self) -> AsyncGenerator[bytes, None]:
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
