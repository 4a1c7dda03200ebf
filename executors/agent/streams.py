"""The executor's end of a console's link: what the console sent is read to the end, even when
the link fails under one of the executor's writes.

An executor busy as a console closed a link right after an order (frozen, or its loop held)
woke with a write queued to that link (a heartbeat, or a Health its sampler thread handed the
loop) and the order still in its socket, unread. The write failed first; asyncio then stopped
reading the link, and its stream reader raised the error before the frames it held: the order
was dropped (5 Stops of 6 in ``tests/console/fleet/test_link_finish.py``; a quitting console's
last lease). Here a link lost to a reset or a broken pipe is read out first, what the socket
still holds included, and then ends as a close does. The console finishes its links too
(``ExecutorLink.finish``); each side is enough on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Awaitable, Callable

Client = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
READ_OUT_MAX = 1 << 20
"""The most a lost link is read out (a console's orders are a few hundred bytes)."""


class _ReadToTheEnd(asyncio.StreamReaderProtocol):
    def __init__(self, reader: asyncio.StreamReader, client: Client) -> None:
        super().__init__(reader, client)
        self._reader = reader
        self._fd: int | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        sock = transport.get_extra_info("socket")
        self._fd = sock.fileno() if sock is not None else None
        super().connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if isinstance(exc, (ConnectionResetError, BrokenPipeError)):
            self._read_out()
            exc = None  # the frames read are handed out, then the end
        super().connection_lost(exc)

    def _read_out(self) -> None:
        """What the socket still holds (it is open until this returns, and non-blocking)."""
        if self._fd is None:
            return
        got = 0
        with contextlib.suppress(OSError):
            while got < READ_OUT_MAX and (chunk := os.read(self._fd, 65536)):
                self._reader.feed_data(chunk)
                got += len(chunk)


async def serve_unix(client: Client, sock: socket.socket) -> asyncio.Server:
    """``asyncio.start_unix_server`` on a listening ``sock``, each link read to the end."""
    loop = asyncio.get_running_loop()
    return await loop.create_unix_server(
        lambda: _ReadToTheEnd(asyncio.StreamReader(), client), sock=sock
    )
