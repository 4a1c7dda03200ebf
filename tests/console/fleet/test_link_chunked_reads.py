"""ExecutorLink reads its stream in chunks: whatever arrives in one read, frames split over many
reads, an end inside a frame and an oversized length, over both real transports.

The executor here is a separate process serving a real Unix socket; the console reaches it
through ``LocalTransport`` (the socket itself) or ``SshTransport`` (a streamlocal channel
through a real sshd on loopback).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from support import sshbed

from console.fleet.link import ExecutorLink, LinkError
from console.reach.transport.base import Transport
from console.reach.transport.local import LocalTransport
from console.reach.transport.ssh import SshTarget, SshTransport
from protocol.framing import MAX_FRAME, encode_frame
from protocol.messages import (
    PROTOCOL_VERSION,
    ExecutorHello,
    ExecutorMessage,
    GpuHealth,
    Health,
    Heartbeat,
    Log,
)

# Serves one connection: reads the console's Hello frame, sends the bytes of a file either in
# one write or one byte per write, then closes or waits for the console to close (and says so).
FAKE_EXECUTOR = r"""
import os, socket, sys, time
path, data_path, mode, then = sys.argv[1:5]
data = open(data_path, "rb").read()
s = socket.socket(socket.AF_UNIX)
s.bind(path + ".tmp")
s.listen()  # before the path appears: a console that finds it can connect
os.rename(path + ".tmp", path)
s.settimeout(60)
c, _ = s.accept()
c.settimeout(60)
def exactly(n):
    got = b""
    while len(got) < n:
        more = c.recv(n - len(got))
        if not more:
            sys.exit("console closed during its Hello")
        got += more
    return got
exactly(int.from_bytes(exactly(4), "big"))
if mode == "whole":
    c.sendall(data)
else:
    for i in range(len(data)):
        c.sendall(data[i : i + 1])
        time.sleep(0.0005)
if then == "close":
    c.close()
else:
    while c.recv(65536):
        pass
    open(path + ".closed", "w").close()
"""

HELLO = ExecutorHello(
    version=PROTOCOL_VERSION,
    executor="e1",
    pid=4242,
    hostname="h1",
    workdir="/w",
    state="idle",
    clock=100.0,
)


def beat(seq: int) -> Heartbeat:
    return Heartbeat(seq=seq, t=1000.0 + seq, state="idle", step=seq, epoch=0, clock=100.0 + seq)


HEALTH = Health(
    t=1000.5,
    cpu_pct=12.5,
    mem_used_pct=40.0,
    mem_available_mb=64000.0,
    disk_free_mb=1e6,
    disk_total_mb=2e6,
    gpu_status="ok",
    gpus=tuple(
        GpuHealth(
            index=i,
            name="NVIDIA H100 80GB HBM3",
            util_pct=97.0,
            mem_used_mb=70000.0,
            mem_total_mb=81920.0,
            temp_c=71.0,
            power_w=650.0,
            ecc_corrected=0,
            ecc_uncorrected=0,
        )
        for i in range(8)
    ),
)


@pytest.fixture(scope="module")
def ssh_host() -> Iterator[sshbed.SshHost]:
    with sshbed.ssh_bed() as bed:
        yield bed.host()


@pytest.fixture
def folder() -> Iterator[Path]:
    """Short, so a Unix socket path in it stays under 108 bytes."""
    path = Path(tempfile.mkdtemp(prefix="lk-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(params=["local", "ssh"])
async def transport(request: pytest.FixtureRequest) -> AsyncIterator[Transport]:
    if request.param == "local":
        yield LocalTransport("h1", default_timeout=10.0)
        return
    host: sshbed.SshHost = request.getfixturevalue("ssh_host")
    target = SshTarget(
        name=host.name,
        addresses=[host.address],
        port=host.port,
        user="root",
        identity=str(host.bed.client_key),
        known_hosts=str(host.bed.known_hosts),
        connect_timeout=5.0,
        keepalive_s=5.0,
        command_timeout=20.0,
    )
    async with SshTransport(target) as t:
        yield t


@contextlib.asynccontextmanager
async def executor(
    t: Transport, folder: Path, data: bytes, *, mode: str = "whole", then: str = "close"
) -> AsyncIterator[str]:
    """A fake executor process serving ``data`` on a socket in ``folder``; its socket path."""
    (folder / "fake.py").write_text(FAKE_EXECUTOR)
    (folder / "data").write_bytes(data)
    sock = str(folder / "e.sock")
    argv = [sys.executable, str(folder / "fake.py"), sock, str(folder / "data"), mode, then]
    pid = await t.start_detached(argv, log_path=str(folder / "fake.log"), cwd=str(folder))
    try:
        deadline = time.monotonic() + 10
        while not os.path.exists(sock):
            assert time.monotonic() < deadline, (folder / "fake.log").read_text()
            await asyncio.sleep(0.01)
        yield sock
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


async def run_link(t: Transport, sock: str, timeout: float = 20.0) -> tuple[list[Any], str]:
    """Open a link, pump it to its end; (Hello and every message delivered, why it ended)."""
    link = ExecutorLink(t, sock)
    got: list[Any] = [await link.open(timeout=10)]
    anchors: list[Any] = []

    def on_message(msg: ExecutorMessage) -> None:
        got.append(msg)
        anchors.append(link.anchor)

    async with asyncio.timeout(timeout):
        why = await link.pump(on_message)
    # the anchor follows each Heartbeat as it is delivered, not the newest of a chunk
    for msg, anchor in zip(got[1:], anchors, strict=True):
        if isinstance(msg, Heartbeat):
            assert anchor is not None and anchor[0] == msg.clock
    return got, why


def frames(*msgs: Any) -> bytes:
    return b"".join(encode_frame(m) for m in msgs)


async def wait_for_file(path: Path, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"no {path.name} after {timeout}s"
        await asyncio.sleep(0.01)


# ---------------------------------------------------------------------------------------- tests


async def test_many_frames_in_one_write_are_all_delivered_in_order(
    transport: Transport, folder: Path
) -> None:
    """The Hello and 600 messages behind it, sent with one write: whatever the first read of
    open() takes beyond the Hello is kept for pump, in order."""
    msgs: list[Any] = []
    for i in range(200):
        msgs += [beat(i), HEALTH, Log(level="info", text=f"line {i} " + "x" * (i % 50))]
    async with executor(transport, folder, frames(HELLO, *msgs)) as sock:
        got, why = await run_link(transport, sock)
    assert why == "the executor closed the connection"
    assert got == [HELLO, *msgs]


async def test_frames_sent_one_byte_at_a_time_are_delivered_whole(
    transport: Transport, folder: Path
) -> None:
    msgs = [beat(1), HEALTH, beat(2)]
    async with executor(transport, folder, frames(HELLO, *msgs), mode="bytewise") as sock:
        got, why = await run_link(transport, sock)
    assert why == "the executor closed the connection"
    assert got == [HELLO, *msgs]


async def test_a_frame_larger_than_one_read_is_delivered_whole(
    transport: Transport, folder: Path
) -> None:
    big = Log(level="info", text="y" * (3 * 1024 * 1024))  # dozens of 64 KiB reads
    msgs = [beat(1), big, beat(2)]
    async with executor(transport, folder, frames(HELLO, *msgs)) as sock:
        got, why = await run_link(transport, sock, timeout=60)
    assert why == "the executor closed the connection"
    assert got == [HELLO, *msgs]


@pytest.mark.parametrize(
    ("cut", "words"),
    [
        (2, "truncated frame header: 2 of 4 bytes"),
        (4, "truncated frame: connection closed after 0 of {n} bytes"),
        (9, "truncated frame: connection closed after 5 of {n} bytes"),
    ],
)
async def test_the_end_of_the_stream_inside_a_frame_is_a_protocol_error(
    transport: Transport, folder: Path, cut: int, words: str
) -> None:
    """The same words read_message gave; the messages before it are delivered."""
    cut_short = encode_frame(beat(2))
    data = frames(HELLO, beat(1)) + cut_short[:cut]
    async with executor(transport, folder, data, mode="bytewise" if cut == 2 else "whole") as sock:
        got, why = await run_link(transport, sock)
    assert got == [HELLO, beat(1)]
    assert why == "protocol error: " + words.format(n=len(cut_short) - 4)


async def test_the_end_of_the_stream_inside_the_hello_fails_open(
    transport: Transport, folder: Path
) -> None:
    async with executor(transport, folder, encode_frame(HELLO)[:10]) as sock:
        link = ExecutorLink(transport, sock)
        with pytest.raises(LinkError, match="truncated frame: connection closed after 6 of"):
            await link.open(timeout=10)


@pytest.mark.parametrize("length", [MAX_FRAME + 1, 2**32 - 1])
async def test_an_oversized_length_is_refused_without_waiting_for_its_body(
    transport: Transport, folder: Path, length: int
) -> None:
    """Only the 4 header bytes come, and the executor stays connected: a reader that waited for
    the body would hang. The link ends at once and closes the connection."""
    data = frames(HELLO, beat(1)) + length.to_bytes(4, "big")
    async with executor(transport, folder, data, then="stay") as sock:
        t0 = time.monotonic()
        got, why = await run_link(transport, sock, timeout=10)
        assert time.monotonic() - t0 < 5
        await wait_for_file(folder / "e.sock.closed")  # the executor saw the link close
    assert got == [HELLO, beat(1)]
    assert why == f"protocol error: frame length {length} exceeds the {MAX_FRAME}-byte limit"


async def test_a_malformed_frame_behind_good_ones_in_the_same_read_ends_the_link(
    transport: Transport, folder: Path
) -> None:
    """The good messages first, then the error at once, though nothing more arrives."""
    bad = (3).to_bytes(4, "big") + b"\xc1\xc1\xc1"  # 0xc1 is never valid msgpack
    data = frames(HELLO, beat(1), beat(2)) + bad + frames(beat(3))
    async with executor(transport, folder, data, then="stay") as sock:
        got, why = await run_link(transport, sock, timeout=10)
        await wait_for_file(folder / "e.sock.closed")
    assert got == [HELLO, beat(1), beat(2)]
    assert why.startswith("protocol error: malformed executor->console frame payload")
    assert "\n" not in why


async def test_open_still_times_out_when_no_hello_comes(transport: Transport, folder: Path) -> None:
    async with executor(transport, folder, b"", then="stay") as sock:
        link = ExecutorLink(transport, sock)
        t0 = time.monotonic()
        with pytest.raises(LinkError, match=r"timed out after 0.5s waiting for a frame"):
            await link.open(timeout=0.5)
        assert time.monotonic() - t0 < 5


async def test_a_link_closed_by_a_message_handler_delivers_nothing_more(
    transport: Transport, folder: Path
) -> None:
    msgs = [beat(i) for i in range(20)]
    async with executor(transport, folder, frames(HELLO, *msgs), then="stay") as sock:
        link = ExecutorLink(transport, sock)
        await link.open(timeout=10)
        got: list[Any] = []

        def on_message(msg: ExecutorMessage) -> None:
            got.append(msg)
            if len(got) == 3:
                link.close()

        async with asyncio.timeout(10):
            why = await link.pump(on_message)
        await wait_for_file(folder / "e.sock.closed")
    assert got == msgs[:3]
    assert why == "closed by the console"


async def test_an_error_in_the_consoles_handler_is_named_not_taken_for_a_lost_connection(
    transport: Transport, folder: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A bug in a watch's handler once read as "connection lost" and the job went on with the
    handler broken. The link ends saying it was the console's error, with the traceback logged."""
    msgs = [beat(1), HEALTH, beat(2)]
    async with executor(transport, folder, frames(HELLO, *msgs), then="wait") as sock:
        link = ExecutorLink(transport, sock)
        await link.open(timeout=10)
        seen: list[Any] = []

        def on_message(msg: ExecutorMessage) -> None:
            seen.append(msg)
            if isinstance(msg, Health):
                raise KeyError("no such job")

        async with asyncio.timeout(20):
            why = await link.pump(on_message)
    assert seen == msgs[:2], "nothing after the failing message"
    assert why.startswith("console error handling a Health message"), why
    assert "KeyError: 'no such job'" in why and "connection lost" not in why
    (record,) = [r for r in caplog.records if r.name == "console.fleet.link"]
    assert record.exc_info is not None and record.exc_info[0] is KeyError
