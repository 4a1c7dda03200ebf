"""The protocol decoder against 100k random and mutated frames, from a seeded ``random.Random``.

Complements the hypothesis tests of tests/protocol/test_framing.py with volume: every case
goes through ``FrameBuffer`` in random chunking; only ``ProtocolError`` (one line) may come
out, every decoded message is of the direction's types, no case takes long, and a huge
length is refused on the header alone, before a payload buffer exists.
"""

from __future__ import annotations

import asyncio
import collections
import random
import socket
import struct
import time
import tracemalloc
from collections.abc import Callable
from typing import Any, get_args

import msgspec
import pytest

from protocol import (
    CONSOLE_MESSAGES,
    EXECUTOR_MESSAGES,
    MAX_FRAME,
    PROTOCOL_VERSION,
    ConsoleMessage,
    ExecutorMessage,
    FrameBuffer,
    JobSpec,
    ProtocolError,
    encode_frame,
    read_message,
    recv_message,
)
from protocol.framing import MessageDecoder
from protocol.messages import (
    Abandon,
    CheckpointNow,
    CheckpointSaved,
    ConsoleHello,
    Drain,
    ExecutorHello,
    Fault,
    Finished,
    GpuHealth,
    Health,
    Heartbeat,
    Lease,
    Log,
    Ping,
    Progress,
    Resumed,
    Start,
    Stop,
    Stopped,
)
from protocol.spec import CheckpointManifest

CASES = 100_000
SEED = 20240606
MAX_CASE_S = 1.0
"""No single case may take this long: all bytes are there, so nothing may wait."""

SPEC = JobSpec(name="fuzz", steps=100, seed=7, config={"n_layer": 2, "note": "héllo"})
MANIFEST = CheckpointManifest(
    job="fuzz",
    step=50,
    file="step-0000000050.pt",
    size=1234,
    sha256="ab" * 32,
    epoch=2,
    spec_hash="0123456789abcdef",
    code_version="0.1.0",
    created_at=1.5,
)
GPU = GpuHealth(index=0, name="H100", util_pct=99.0, temp_c=70.0, throttle=("sw",), xids=(79,))
CONSOLE = [
    ConsoleHello(version=PROTOCOL_VERSION, console_id="c"),
    Start(spec=SPEC, epoch=3, lease_s=10.0, lease_anchor=5.0),
    Lease(epoch=3, ttl_s=10.0, anchor=1.0),
    CheckpointNow(),
    Stop(checkpoint=False),
    Drain(),
    Ping(nonce=9),
    Abandon(epoch=3),
]
EXECUTOR = [
    ExecutorHello(
        version=PROTOCOL_VERSION, executor="torch", pid=1, hostname="h", workdir="/w", state="idle"
    ),
    Heartbeat(seq=1, t=2.0, state="training", step=3, epoch=1, lease_left_s=4.0),
    Health(
        t=1.0,
        cpu_pct=1.0,
        mem_used_pct=2.0,
        mem_available_mb=3.0,
        disk_free_mb=4.0,
        disk_total_mb=5.0,
        gpus=(GPU, GpuHealth(index=1, lost=True)),
    ),
    Progress(step=1, steps=2, loss=0.5, steps_per_s=3.0, eta_s=None),
    CheckpointSaved(manifest=MANIFEST, path="/p", manifest_path="/m", write_s=0.1, stall_s=0.0),
    Resumed(step=0, checkpoint=None, epoch=0, load_s=0.0),
    Fault(fault="nan", message="x\ny"),
    Log(level="info", text="\x00ü"),
    Finished(step=2, params_sha256="cd" * 32),
    Stopped(step=1, reason="lease_lost", checkpoint_step=None),
]
DIRECTIONS: list[tuple[list[Any], MessageDecoder[Any], tuple[type, ...]]] = [
    (CONSOLE, CONSOLE_MESSAGES, get_args(ConsoleMessage)),
    (EXECUTOR, EXECUTOR_MESSAGES, get_args(ExecutorMessage)),
]
KINDS = ["random", "random_payload", "garbage_msgpack", "flip", "truncate", "insert", "delete"]
KINDS += ["length", "length_delta", "huge_length", "splice", "intact"]

_msgpack = msgspec.msgpack.Encoder()


def frame(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


def random_value(rng: random.Random, depth: int = 0) -> Any:
    """Any msgpack value, including the right keys with the wrong types."""
    pick = rng.randrange(9 if depth < 3 else 6)
    if pick == 0:
        return rng.randrange(-(2**63), 2**64)
    if pick == 1:
        return rng.random() * 10 ** rng.randrange(-5, 300)
    if pick == 2:
        return rng.choice(["", "training", "hello", "\x00", "ü" * 20, "x" * 300])
    if pick == 3:
        return rng.choice([None, True, False])
    if pick == 4:
        return rng.randbytes(rng.randrange(8))
    if pick == 5:
        return rng.choice([float("nan"), float("inf"), -0.0])
    if pick == 6:
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    keys = ["kind", "version", "step", "spec", "gpus", "manifest", "epoch", "t", "name", "zz"]
    table = {rng.choice(keys): random_value(rng, depth + 1) for _ in range(rng.randrange(5))}
    if rng.random() < 0.7:
        table["kind"] = rng.choice(["hello", "health", "start", "heartbeat", "checkpoint", "??"])
    return table


def mutate(rng: random.Random, kind: str, msgs: list[Any]) -> bytes:
    frames = [encode_frame(rng.choice(msgs)) for _ in range(rng.randint(1, 3))]
    data = bytearray(b"".join(frames))
    if kind == "random":
        return rng.randbytes(rng.randrange(64))
    if kind == "random_payload":
        return frame(rng.randbytes(rng.randrange(48)))
    if kind == "garbage_msgpack":
        return frame(_msgpack.encode(random_value(rng)))
    if kind == "intact":
        return bytes(data)
    if kind == "splice":  # a frame cut short, then another frame's bytes run on
        cut = rng.randrange(1, len(frames[0]))
        return frames[0][:cut] + encode_frame(rng.choice(msgs))
    if kind in ("length", "length_delta", "huge_length"):
        i = rng.randrange(len(frames))
        start = sum(len(f) for f in frames[:i])
        (old,) = struct.unpack_from(">I", data, start)
        new = {
            "length": rng.randrange(2**32),
            "length_delta": max(0, old + rng.randint(-8, 8)),
            "huge_length": rng.randint(MAX_FRAME + 1, 2**32 - 1),
        }[kind]
        struct.pack_into(">I", data, start, new)
        return bytes(data)
    for _ in range(rng.randint(1, 4)):
        pos = rng.randrange(max(1, len(data)))
        if kind == "flip" and data:
            data[pos] ^= 1 << rng.randrange(8)
        elif kind == "truncate":
            del data[pos:]
        elif kind == "insert":
            data[pos:pos] = rng.randbytes(rng.randint(1, 8))
        elif kind == "delete":
            del data[pos : pos + rng.randint(1, 8)]
    return bytes(data)


def feed(data: bytes, decoder: MessageDecoder[Any], cuts: list[int]) -> tuple[list[Any], Any]:
    """As a connection would: chunks, then end of stream. Any exception but ProtocolError escapes."""
    buf = FrameBuffer(decoder)
    out: list[Any] = []
    try:
        prev = 0
        for cut in [*cuts, len(data)]:
            out += buf.feed(data[prev:cut])
            prev = cut
        buf.close()
    except ProtocolError as e:
        return out, e
    return out, None


def cases(n: int, seed: int) -> Any:
    rng = random.Random(seed)
    for _ in range(n):
        msgs, decoder, types = rng.choice(DIRECTIONS)
        kind = rng.choice(KINDS)
        data = mutate(rng, kind, msgs)
        cuts = sorted(rng.randrange(len(data) + 1) for _ in range(rng.randrange(4)))
        yield kind, data, decoder, types, cuts


def test_protocol_decoder_survives_100k_mutated_frames() -> None:
    counts: collections.Counter[str] = collections.Counter()
    errors: collections.Counter[str] = collections.Counter()
    slowest = 0.0
    start = time.perf_counter()
    for kind, data, decoder, types, cuts in cases(CASES, SEED):
        t0 = time.perf_counter()
        out, err = feed(data, decoder, cuts)
        slowest = max(slowest, time.perf_counter() - t0)
        counts[kind] += 1
        assert all(isinstance(m, types) for m in out), (kind, data)
        if err is not None:
            errors[kind] += 1
            assert str(err) and "\n" not in str(err) and len(str(err)) < 1000, (kind, err)
        if kind == "intact":
            assert err is None and out, data  # the harness itself decodes good frames
        if kind in ("huge_length", "random_payload"):
            assert err is not None, (kind, data)
    elapsed = time.perf_counter() - start
    print(
        f"{sum(counts.values())} frames in {elapsed:.1f} s: {dict(counts)}; errors {dict(errors)}"
    )
    assert sum(counts.values()) == CASES
    assert set(counts) == set(KINDS)
    assert slowest < MAX_CASE_S, f"one case took {slowest:.2f} s"
    # most mutations must actually be refused, or the fuzzing exercised nothing
    assert errors["huge_length"] == counts["huge_length"]
    assert errors["garbage_msgpack"] > 0.9 * counts["garbage_msgpack"]


def test_a_huge_length_is_refused_before_allocating_2000() -> None:
    """2000 headers claiming up to 4 GiB: refused with no payload buffer, by every reader."""
    rng = random.Random(SEED + 1)
    tracemalloc.start()
    try:
        for _ in range(2000):
            length = rng.randint(MAX_FRAME + 1, 2**32 - 1)
            data = struct.pack(">I", length) + rng.randbytes(rng.randrange(16))
            buf = FrameBuffer(EXECUTOR_MESSAGES)
            with pytest.raises(ProtocolError, match="exceeds"):
                buf.feed(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, f"peak {peak} bytes while refusing huge lengths"


def test_decoding_mutated_frames_allocates_little_2000() -> None:
    """msgpack headers inside a frame may claim millions of elements: nothing is sized by them."""
    tracemalloc.start()
    try:
        worst = 0
        for _kind, data, decoder, _types, cuts in cases(2000, SEED + 2):
            tracemalloc.reset_peak()
            base, _ = tracemalloc.get_traced_memory()
            feed(data, decoder, cuts)
            _, peak = tracemalloc.get_traced_memory()
            worst = max(worst, peak - base)
        # a msgpack array header claiming 2**32 elements, in a 20-byte frame
        tracemalloc.reset_peak()
        base, _ = tracemalloc.get_traced_memory()
        out, err = feed(frame(b"\xdd\xff\xff\xff\xff" + b"\x00" * 15), EXECUTOR_MESSAGES, [])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert out == [] and err is not None
    assert peak - base < 1 << 20
    assert worst < 1 << 20, f"a mutated frame of a few KB took {worst} bytes to decode"


def _run_async(data: bytes, decoder: MessageDecoder[Any]) -> tuple[list[Any], Any]:
    async def go() -> tuple[list[Any], Any]:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        out: list[Any] = []
        for _ in range(len(data) // 4 + 2):
            try:
                msg = await read_message(reader, decoder, timeout=5)
            except ProtocolError as e:
                return out, e
            if msg is None:
                return out, None
            out.append(msg)
        raise AssertionError("read_message returned messages past the end of the data")

    return asyncio.run(go())


def _run_socket(data: bytes, decoder: MessageDecoder[Any]) -> tuple[list[Any], Any]:
    a, b = socket.socketpair()
    try:
        b.settimeout(5)
        a.sendall(data)
        a.shutdown(socket.SHUT_WR)
        out: list[Any] = []
        for _ in range(len(data) // 4 + 2):
            try:
                msg = recv_message(b, decoder)
            except ProtocolError as e:
                return out, e
            if msg is None:
                return out, None
            out.append(msg)
        raise AssertionError("recv_message returned messages past the end of the data")
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("reader", [_run_async, _run_socket], ids=["read_message", "recv_message"])
def test_stream_readers_agree_with_frame_buffer_on_3000_mutated_frames(
    reader: Callable[[bytes, MessageDecoder[Any]], tuple[list[Any], Any]],
) -> None:
    n = 0
    for kind, data, decoder, _types, _cuts in cases(3000, SEED + 3):
        if len(data) > 16384:  # a socketpair buffer holds this much without a reader
            continue
        out, err = feed(data, decoder, [])
        sout, serr = reader(data, decoder)
        assert sout == out, (kind, data)
        assert (serr is None) == (err is None), (kind, err, serr)
        if serr is not None:
            assert "timed out" not in str(serr), (kind, serr)
        n += 1
    assert n > 2900
