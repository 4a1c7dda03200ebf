"""One protocol connection to one executor, over a transport's stream to its Unix socket."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections import deque
from collections.abc import Callable

from console import clock
from console.reach.transport.base import (
    StreamReaderLike,
    StreamWriterLike,
    Transport,
    TransportError,
)
from protocol.errors import HotspareError, ProtocolError
from protocol.framing import EXECUTOR_MESSAGES, FrameReader, check_hello, encode_frame
from protocol.messages import (
    PROTOCOL_VERSION,
    ConsoleHello,
    ConsoleMessage,
    ExecutorHello,
    ExecutorMessage,
    Heartbeat,
    Ping,
)

HELLO_TIMEOUT_S = 10.0
SEND_TIMEOUT_S = 5.0
FINISH_TIMEOUT_S = 2.0
"""How long a link being finished waits for the executor to close its end."""
LOWS_KEPT = 256

_log = logging.getLogger(__name__)


class LinkError(HotspareError):
    """The link could not be opened or was lost; ``str()`` says why in one line."""

    permanent = False


class ExecutorLink:
    def __init__(
        self,
        transport: Transport,
        socket_path: str,
        console_id: str = "hotspare",
        term: int = 0,
    ) -> None:
        self.transport = transport
        self.socket_path = socket_path
        self.console_id = console_id
        self.term = term
        """The controller's term, said in the Hello (``executors/fencing/term.py``)."""
        self.hello: ExecutorHello | None = None
        self.anchor: tuple[float, float] | None = None
        """(the executor's clock, this console's ``clock.mono()`` when that reading arrived)
        from its newest Hello or Heartbeat: what a lease is anchored to."""
        self._reader: StreamReaderLike | None = None
        self._writer: StreamWriterLike | None = None
        self._frames: FrameReader[ExecutorMessage] | None = None
        """The reader's messages: a read takes every frame that has arrived (over SSH, one
        pass through the channel's read lock instead of two per frame)."""
        self._pumping: asyncio.Task[str] | None = None
        self._closed_here = False
        self._fresh = asyncio.Event()
        """Set, and replaced by a new one, at each clock reading and when the link closes."""
        self._answer: Heartbeat | None = None
        """The Heartbeat that answered the newest Ping the executor answered (it names the
        Ping's nonce)."""
        self.lease_lows: deque[tuple[float, float]] = deque(maxlen=LOWS_KEPT)
        """(``clock.mono()`` at arrival, ``lease_low_s``) of the newest heartbeats that had one:
        how much lease was left when renewals reached the executor."""

    async def open(self, timeout: float = HELLO_TIMEOUT_S) -> ExecutorHello:
        try:
            self._reader, self._writer = await self.transport.open_socket(
                self.socket_path, timeout=timeout
            )
            self._frames = FrameReader(self._reader, EXECUTOR_MESSAGES)
            await self.send(
                ConsoleHello(version=PROTOCOL_VERSION, console_id=self.console_id, term=self.term)
            )
            hello = await self._frames.next(timeout=timeout)
        except (TransportError, ProtocolError, OSError, LinkError) as e:
            self.close()
            raise LinkError(f"{self.transport.name}: cannot open {self.socket_path}: {e}") from None
        if hello is None:
            self.close()
            raise LinkError(
                f"{self.transport.name}: the executor closed the connection during Hello"
            )
        try:
            check_hello(hello, ExecutorHello)
        except ProtocolError as e:
            self.close()
            raise LinkError(f"{self.transport.name}: {e}") from None
        assert isinstance(hello, ExecutorHello)
        self.hello = hello
        self._reading(hello.clock)
        return hello

    def _reading(self, executor_clock: float) -> None:
        self.anchor = (executor_clock, clock.mono())
        fresh, self._fresh = self._fresh, asyncio.Event()
        fresh.set()

    async def reading_after(self, executor_clock: float, timeout: float) -> bool:
        """Wait up to ``timeout`` for a clock reading newer than ``executor_clock``; whether
        one has arrived (False too once the link is closed)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while self._frames is not None and not self._newer(executor_clock):
                    await self._fresh.wait()
        return self._frames is not None and self._newer(executor_clock)

    async def fresh_reading(self, timeout: float) -> bool:
        """Ask the executor for a clock reading now (a Ping) and wait up to ``timeout`` for its
        answer to be read: then ``anchor`` is a reading taken after the Ping was sent, however
        many older readings were queued unread (a stalled loop reads those first, each as if it
        had just arrived). Whether it came (False too once the link is closed)."""
        return await self.answer(timeout) is not None

    async def answer(self, timeout: float) -> Heartbeat | None:
        """A Ping, and the Heartbeat that answers it, read by the link's pump within
        ``timeout`` (None: none came, or the link closed). The executor handles a link's
        messages in order, so everything sent before the Ping has been handled by then: its
        ``lease_left_s`` is the lease after any renewal sent before."""
        nonce = secrets.randbits(62) + 1
        await self.send(Ping(nonce=nonce))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while self._frames is not None and not self._answers(nonce):
                    await self._fresh.wait()
        return self._answer if self._frames is not None and self._answers(nonce) else None

    def _answers(self, nonce: int) -> bool:
        return self._answer is not None and self._answer.nonce == nonce

    @property
    def pumped(self) -> bool:
        """Its messages are being read (``pump``): a newer clock reading may come."""
        return self._pumping is not None and not self._pumping.done()

    @property
    def closed(self) -> bool:
        """Not open (yet, or any more)."""
        return self._frames is None

    def _newer(self, executor_clock: float) -> bool:
        return self.anchor is not None and self.anchor[0] > executor_clock

    async def send(self, msg: ConsoleMessage) -> None:
        if self._writer is None:
            raise LinkError(f"{self.transport.name}: link is closed")
        try:
            self._writer.write(encode_frame(msg))
            async with asyncio.timeout(SEND_TIMEOUT_S):
                await self._writer.drain()
        except TimeoutError:
            raise LinkError(
                f"{self.transport.name}: send timed out after {SEND_TIMEOUT_S:g}s"
            ) from None
        except Exception as e:  # noqa: BLE001 - any stream error here means the link is gone
            raise LinkError(
                f"{self.transport.name}: send failed: {type(e).__name__}: {e}"
            ) from None

    async def pump(self, on_message: Callable[[ExecutorMessage], None]) -> str:
        """Deliver messages until the link ends; returns why it ended (one line)."""
        frames = self._frames
        if frames is None:
            return "link is closed"
        self._pumping = asyncio.current_task()
        try:
            while True:
                batch = await frames.batch()
                if not batch:
                    return "the executor closed the connection"
                for msg in batch:
                    if isinstance(msg, Heartbeat):
                        if msg.nonce is not None:
                            self._answer = msg
                        self._reading(msg.clock)
                        if msg.lease_low_s is not None:
                            self.lease_lows.append((clock.mono(), msg.lease_low_s))
                    try:
                        on_message(msg)
                    except Exception as e:  # noqa: BLE001 - the console's bug, not the link's
                        _log.exception("handling %s from %s", type(msg).__name__, self.socket_path)
                        return (
                            f"console error handling a {type(msg).__name__} message (a bug; "
                            f"traceback in the console's log): {type(e).__name__}: {e}"
                        )
                    if self._frames is not frames:  # on_message closed the link
                        return "closed by the console"
        except ProtocolError as e:
            return f"protocol error: {e}"
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self._closed_here and task is not None and task.uncancel() == 0:
                return "closed by the console"
            raise
        except Exception as e:  # noqa: BLE001 - a dropped stream of any transport ends the link
            return f"connection lost: {type(e).__name__}: {e}".rstrip(": ")
        finally:
            self.close()

    async def finish(self, timeout: float = FINISH_TIMEOUT_S) -> None:
        """Close once the executor has read what was sent (an order the link's last words):
        its end of the link is shut for writing, so the executor reads every frame and then
        the end, closes, and the link closes after it (or after ``timeout``). Closed at once,
        an executor busy at that moment wrote to the closed link first (a heartbeat), failed,
        and its asyncio reader raised that error before handing out the frames it held: 5
        Stops of 6 to a briefly frozen executor never heard (``test_link_finish.py``), a
        quitting console's last lease lost (``leave.py``)."""
        writer, frames, pump = self._writer, self._frames, self._pumping
        if writer is None or frames is None:
            return
        try:
            writer.write_eof()
            async with asyncio.timeout(timeout):
                if pump is not None and not pump.done():
                    await asyncio.wait({pump})  # the pump reads on, and ends at the close
                else:
                    while await frames.batch():
                        pass
        except Exception:  # noqa: BLE001 - timed out, or the link went: closed either way
            pass
        finally:
            self.close()

    def close(self) -> None:
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.close()
        self._reader = self._writer = None
        self._frames = None
        self._fresh.set()  # a renewal waiting for a reading from this link waits no more
        # A read over a dead path (a partition) does not end when the stream is closed: an SSH
        # channel waits for the peer's close, i.e. for the keepalive to give up. Stop it here.
        task, self._pumping = self._pumping, None
        with contextlib.suppress(RuntimeError):  # no running loop: nothing is pumping
            if task is not None and not task.done() and task is not asyncio.current_task():
                self._closed_here = True
                task.cancel()
