"""The wire framing: every message round-trips in any chunking; every bad input is a ProtocolError."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import (
    CONSOLE_MESSAGES,
    EXECUTOR_MESSAGES,
    MAX_FRAME,
    PROTOCOL_VERSION,
    CheckpointManifest,
    ConsoleMessage,
    ExecutorMessage,
    FrameBuffer,
    JobSpec,
    ProtocolError,
    check_hello,
    encode_frame,
    read_message,
    recv_message,
    send_message,
    write_message,
)
from protocol.faults import FaultKind, StopReason
from protocol.framing import MessageDecoder
from protocol.messages import (
    Abandon,
    CheckpointNow,
    CheckpointSaved,
    ConsoleHello,
    Drain,
    ExecutorHello,
    ExecutorState,
    Fault,
    Finished,
    GpuHealth,
    Health,
    Heartbeat,
    Lease,
    Log,
    Ping,
    Prepare,
    Progress,
    Resumed,
    RunEnded,
    Start,
    Stop,
    Stopped,
)

ROOT = Path(__file__).resolve().parents[2]

SPEC = JobSpec(
    name="demo-charlm.v2",
    workload="charlm",
    steps=2000,
    seed=1234,
    checkpoint_every_steps=50,
    checkpoint_every_s=30.5,
    keep_checkpoints=4,
    config={
        "n_layer": 4,
        "lr": 3e-4,
        "betas": [0.9, 0.95],
        "data": {"corpus": "/data/tiny shakespeare.txt", "block": 128},
        "compile": False,
        "note": "héllo ✓",
    },
)
MANIFEST = CheckpointManifest(
    job="demo-charlm.v2",
    step=1500,
    file="step-0000001500.pt",
    size=48_123_456,
    sha256="9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    epoch=3,
    spec_hash="0123456789abcdef",
    code_version="0.1.0+g5d609bf",
    created_at=1_718_000_000.25,
)
GPU_OK = GpuHealth(
    index=0,
    name="NVIDIA H100 80GB HBM3",
    util_pct=97.0,
    mem_used_mb=61_234.5,
    mem_total_mb=81_559.0,
    temp_c=71.0,
    power_w=612.25,
    throttle=(),
    ecc_corrected=12,
    ecc_uncorrected=0,
    retired_pages_sbe=0,
    retired_pages_dbe=0,
    remapped_rows_corrected=1,
    remapped_rows_uncorrected=0,
    remap_pending=False,
    remap_failure=False,
    pcie_replays=3,
    xids=(),
)
GPU_BAD = GpuHealth(
    index=1,
    name="NVIDIA H100 80GB HBM3",
    throttle=("hw_thermal_slowdown", "sw_power_cap"),
    ecc_uncorrected=2,
    remap_failure=True,
    xids=(48, 79),
)
GPU_LOST = GpuHealth(index=2, lost=True)

CONSOLE_EXAMPLES: list[Any] = [
    ConsoleHello(version=PROTOCOL_VERSION, console_id="ops-laptop/4242"),
    ConsoleHello(version=PROTOCOL_VERSION),
    Start(spec=SPEC, epoch=7, lease_s=15.0, rank=0, world_size=1),
    Start(spec=JobSpec(name="x", steps=1)),
    Lease(epoch=7, ttl_s=15.0),
    CheckpointNow(reason="replicate before drain"),
    CheckpointNow(),
    Stop(reason=StopReason.OPERATOR, checkpoint=False),
    Drain(reason=StopReason.MIGRATE),
    Ping(nonce=2**63 - 1),
    Prepare(spec=SPEC),
    Abandon(epoch=3),
]
EXECUTOR_EXAMPLES: list[Any] = [
    ExecutorHello(
        version=PROTOCOL_VERSION,
        executor="torch",
        pid=31337,
        hostname="gpu-a-07",
        workdir="/srv/hotspare/jobs/demo-charlm.v2",
        state=ExecutorState.TRAINING,
        job="demo-charlm.v2",
        epoch=7,
        step=1501,
    ),
    ExecutorHello(
        version=PROTOCOL_VERSION,
        executor="torch",
        pid=1,
        hostname="h",
        workdir="/w",
        state=ExecutorState.IDLE,
    ),
    Heartbeat(seq=99, t=1_718_000_001.5, state="training", step=1501, epoch=7, lease_left_s=9.75),
    Heartbeat(seq=100, t=1.0, state="idle", step=0, epoch=0, nonce=-5),
    Health(
        t=1_718_000_002.0,
        cpu_pct=312.5,
        mem_used_pct=41.0,
        mem_available_mb=120_000.0,
        disk_free_mb=500_000.0,
        disk_total_mb=1_900_000.0,
        disk_read_bps=1.5e6,
        disk_write_bps=2.5e8,
        net_rx_bps=1e3,
        net_tx_bps=0.0,
        gpu_status="3 GPUs",
        gpus=(GPU_OK, GPU_BAD, GPU_LOST),
    ),
    Health(
        t=0.0,
        cpu_pct=0.0,
        mem_used_pct=0.0,
        mem_available_mb=0.0,
        disk_free_mb=0.0,
        disk_total_mb=0.0,
    ),
    Progress(
        step=1501,
        steps=2000,
        loss=1.4375,
        steps_per_s=12.5,
        tokens_per_s=102_400.0,
        eta_s=39.92,
        micro_batch=8,
        accumulation=4,
        epoch=7,
    ),
    CheckpointSaved(
        manifest=MANIFEST,
        path="/srv/hotspare/jobs/demo/checkpoints/step-0000001500.pt",
        manifest_path="/srv/hotspare/jobs/demo/checkpoints/step-0000001500.json",
        write_s=0.81,
        stall_s=0.02,
    ),
    Resumed(step=1500, checkpoint="step-0000001500.pt", epoch=8, load_s=0.4),
    Resumed(step=0, checkpoint=None, epoch=0, load_s=0.0),
    Fault(fault="oom", message="CUDA out of memory; micro-batch 8 -> 4", step=1502, fatal=False),
    Log(level="warning", text="line one\nline two\x00 with NUL and ünïcödé"),
    Finished(step=2000, params_sha256="ab" * 32),
    Stopped(step=1510, reason=StopReason.LEASE_LOST, checkpoint_step=1510, exit_code=75),
    RunEnded(step=1510, fault=FaultKind.CRASH, message="exit 137 (SIGKILL)", exit_code=1),
    RunEnded(
        step=0, fault=FaultKind.HANG, message="no progress", exit_code=1, checkpoint_step=None
    ),
]


def _union_types(union: Any) -> set[type]:
    return set(get_args(union))


def test_examples_cover_every_message_type() -> None:
    assert {type(m) for m in CONSOLE_EXAMPLES} == _union_types(ConsoleMessage)
    assert {type(m) for m in EXECUTOR_EXAMPLES} == _union_types(ExecutorMessage)


def _ids(msgs: list[Any]) -> list[str]:
    return [f"{type(m).__name__}-{i}" for i, m in enumerate(msgs)]


ALL = [(m, CONSOLE_MESSAGES) for m in CONSOLE_EXAMPLES] + [
    (m, EXECUTOR_MESSAGES) for m in EXECUTOR_EXAMPLES
]


def feed_all(buf: FrameBuffer[Any], data: bytes, cuts: list[int]) -> list[Any]:
    out: list[Any] = []
    prev = 0
    for cut in [*sorted(cuts), len(data)]:
        out += buf.feed(data[prev:cut])
        prev = cut
    return out


# ------------------------------------------------------------------------ round trips


@pytest.mark.parametrize(("msg", "decoder"), ALL, ids=_ids([m for m, _ in ALL]))
def test_each_message_round_trips_byte_by_byte(msg: Any, decoder: MessageDecoder[Any]) -> None:
    frame = encode_frame(msg)
    (length,) = struct.unpack(">I", frame[:4])
    assert length == len(frame) - 4
    buf = FrameBuffer(decoder)
    out = feed_all(buf, frame, list(range(1, len(frame))))
    buf.close()
    assert out == [msg]
    assert type(out[0]) is type(msg)


def test_nested_records_decode_as_their_types() -> None:
    start, health, saved = (
        CONSOLE_EXAMPLES[2],
        EXECUTOR_EXAMPLES[4],
        EXECUTOR_EXAMPLES[7],
    )
    got_start = CONSOLE_MESSAGES.decode(encode_frame(start)[4:])
    assert isinstance(got_start, Start)
    assert isinstance(got_start.spec, JobSpec)
    assert got_start.spec.state_hash() == SPEC.state_hash()
    got_health = EXECUTOR_MESSAGES.decode(encode_frame(health)[4:])
    assert isinstance(got_health, Health)
    assert [type(g) for g in got_health.gpus] == [GpuHealth] * 3
    assert got_health.gpus[1].xids == (48, 79)
    assert got_health.gpus[2].lost is True
    got_saved = EXECUTOR_MESSAGES.decode(encode_frame(saved)[4:])
    assert isinstance(got_saved, CheckpointSaved)
    assert got_saved.manifest == MANIFEST


@settings(max_examples=300, deadline=None)
@given(
    data=st.data(),
    direction=st.sampled_from(["console", "executor"]),
)
def test_streams_round_trip_in_any_chunking_300(data: st.DataObject, direction: str) -> None:
    pool, decoder = (
        (CONSOLE_EXAMPLES, CONSOLE_MESSAGES)
        if direction == "console"
        else (EXECUTOR_EXAMPLES, EXECUTOR_MESSAGES)
    )
    msgs = data.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=6), label="msgs")
    blob = b"".join(encode_frame(m) for m in msgs)
    cuts = data.draw(st.lists(st.integers(0, len(blob)), max_size=20), label="cuts")
    buf = FrameBuffer(decoder)
    assert feed_all(buf, blob, cuts) == msgs
    buf.close()  # whole frames only: a clean end


def test_encode_frame_at_and_over_the_limit() -> None:
    overhead = len(msgspec.msgpack.encode(Log(level="info", text="")))
    # a msgpack str over 65535 bytes has a 5-byte header instead of 1
    fits = Log(level="info", text="x" * (MAX_FRAME - overhead - 4))
    frame = encode_frame(fits)
    assert len(frame) == 4 + MAX_FRAME
    buf = FrameBuffer(EXECUTOR_MESSAGES)
    assert buf.feed(frame) == [fits]

    too_big = Log(level="info", text="x" * (MAX_FRAME - overhead - 3))
    with pytest.raises(ProtocolError, match=r"Log is 4194305 bytes, over the 4194304-byte"):
        encode_frame(too_big)


def test_frame_buffer_max_frame_is_honoured() -> None:
    frame = encode_frame(Ping(nonce=1))
    assert FrameBuffer(CONSOLE_MESSAGES, max_frame=len(frame) - 4).feed(frame) == [Ping(nonce=1)]
    with pytest.raises(ProtocolError, match="exceeds"):
        FrameBuffer(CONSOLE_MESSAGES, max_frame=len(frame) - 5).feed(frame)


# ------------------------------------------------------------------------ bad input


def test_frame_buffer_close_inside_a_frame_is_truncation() -> None:
    frame = encode_frame(CONSOLE_EXAMPLES[2])
    for cut in (1, 3, 4, 5, len(frame) - 1):
        buf = FrameBuffer(CONSOLE_MESSAGES)
        assert buf.feed(frame[:cut]) == []
        with pytest.raises(ProtocolError, match=rf"closed inside a frame \({cut} bytes"):
            buf.close()


def test_frame_buffer_close_at_a_boundary_is_clean() -> None:
    buf = FrameBuffer(CONSOLE_MESSAGES)
    buf.close()  # nothing at all
    assert buf.feed(encode_frame(Ping(nonce=3)) * 2) == [Ping(nonce=3)] * 2
    buf.close()


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    a.settimeout(5)
    b.settimeout(5)
    yield a, b
    a.close()
    b.close()


@pytest.mark.parametrize("cut", [2, 4, 10])
def test_recv_message_closed_mid_frame(pair: tuple[socket.socket, socket.socket], cut: int) -> None:
    a, b = pair
    frame = encode_frame(CONSOLE_EXAMPLES[2])
    a.sendall(frame[:cut])
    a.close()
    with pytest.raises(ProtocolError, match="truncated frame: connection closed after") as e:
        recv_message(b, CONSOLE_MESSAGES)
    want = f"after {cut} of 4 bytes" if cut < 4 else f"after {cut - 4} of {len(frame) - 4} bytes"
    assert want in str(e.value)


def test_recv_message_clean_close_returns_none(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    for m in CONSOLE_EXAMPLES:
        send_message(a, m)
    a.shutdown(socket.SHUT_WR)
    got = [recv_message(b, CONSOLE_MESSAGES) for _ in CONSOLE_EXAMPLES]
    assert got == CONSOLE_EXAMPLES
    assert recv_message(b, CONSOLE_MESSAGES) is None


def test_recv_message_timeout_is_a_protocol_error(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, b = pair
    b.settimeout(0.2)
    a.sendall(encode_frame(Ping())[:6])
    t0 = time.monotonic()
    with pytest.raises(ProtocolError, match=r"timed out reading a frame \(2 of"):
        recv_message(b, CONSOLE_MESSAGES)
    assert time.monotonic() - t0 < 3


HUGE = struct.pack(">I", 2**31)


def test_oversized_length_fails_on_the_header_alone() -> None:
    buf = FrameBuffer(CONSOLE_MESSAGES)
    assert buf.feed(HUGE[:3]) == []
    tracemalloc.start()
    try:
        with pytest.raises(
            ProtocolError, match=r"frame length 2147483648 exceeds the 4194304-byte"
        ):
            buf.feed(HUGE[3:])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1024 * 1024, f"allocated {peak} bytes for a frame that was refused"


@pytest.mark.parametrize("length", [MAX_FRAME + 1, 2**31, 2**32 - 1])
def test_recv_message_oversized_length_does_not_wait_for_payload(
    pair: tuple[socket.socket, socket.socket], length: int
) -> None:
    a, b = pair
    a.sendall(struct.pack(">I", length))  # the peer stays open and sends nothing more
    with pytest.raises(ProtocolError, match=f"frame length {length} exceeds"):
        recv_message(b, CONSOLE_MESSAGES)


async def test_read_message_oversized_length_does_not_wait_for_payload() -> None:
    reader = asyncio.StreamReader()
    reader.feed_data(HUGE)  # no EOF, no payload: a reader that waited would time out
    with pytest.raises(ProtocolError, match="frame length 2147483648 exceeds"):
        await read_message(reader, CONSOLE_MESSAGES, timeout=5)


def test_max_frame_itself_is_accepted_and_awaits_payload() -> None:
    buf = FrameBuffer(CONSOLE_MESSAGES)
    assert buf.feed(struct.pack(">I", MAX_FRAME)) == []
    with pytest.raises(ProtocolError, match="closed inside a frame"):
        buf.close()


def _frame(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


BAD_PAYLOADS = [
    pytest.param(
        b"\xc1\xc1\xc1", CONSOLE_MESSAGES, "malformed console->executor frame", id="garbage"
    ),
    pytest.param(b"", EXECUTOR_MESSAGES, "malformed executor->console frame", id="empty"),
    pytest.param(
        msgspec.msgpack.encode({"kind": "ping", "nonce": 1}) + b"\x00",
        CONSOLE_MESSAGES,
        "trailing",
        id="trailing-bytes",
    ),
    pytest.param(
        msgspec.msgpack.encode({"kind": "reboot_host", "now": True}),
        CONSOLE_MESSAGES,
        "unknown console->executor message kind: Invalid value 'reboot_host'",
        id="unknown-kind",
    ),
    pytest.param(
        msgspec.msgpack.encode({"nonce": 1}),
        CONSOLE_MESSAGES,
        "unknown console->executor message kind: Object missing required field `kind`",
        id="no-kind",
    ),
    pytest.param(
        msgspec.msgpack.encode({"kind": "lease", "epoch": "seven", "ttl_s": 15.0}),
        CONSOLE_MESSAGES,
        "invalid console->executor message: Expected `int`, got `str` - at `$.epoch`",
        id="wrong-field-type",
    ),
    pytest.param(
        msgspec.msgpack.encode({"kind": "lease", "epoch": 7}),
        CONSOLE_MESSAGES,
        "invalid console->executor message: Object missing required field `ttl_s`",
        id="missing-field",
    ),
    pytest.param(
        msgspec.msgpack.encode(
            {"kind": "start", "spec": {"name": "a/../../etc", "steps": 1}, "epoch": 1}
        ),
        CONSOLE_MESSAGES,
        "at `$.spec.name`",
        id="nested-bad-job-name",
    ),
    pytest.param(
        msgspec.msgpack.encode({"kind": "health", "t": 0.0, "cpu_pct": 0.0}),
        EXECUTOR_MESSAGES,
        "invalid executor->console message: Object missing required field",
        id="health-missing-fields",
    ),
    # every string discriminator is an enum, refused at the edge (a typo in a peer's fault or
    # state is a ProtocolError naming the field, not a fault the console files as unknown)
    pytest.param(
        msgspec.msgpack.encode({"kind": "fault", "fault": "bogus", "message": "m"}),
        EXECUTOR_MESSAGES,
        "invalid executor->console message: Invalid enum value 'bogus' - at `$.fault`",
        id="unknown-fault-kind",
    ),
    pytest.param(
        msgspec.msgpack.encode({"kind": "log", "level": "loud", "text": "t"}),
        EXECUTOR_MESSAGES,
        "Invalid enum value 'loud' - at `$.level`",
        id="unknown-log-level",
    ),
    pytest.param(
        msgspec.msgpack.encode(
            {"kind": "heartbeat", "seq": 1, "t": 0.0, "state": "dancing", "step": 0, "epoch": 1}
        ),
        EXECUTOR_MESSAGES,
        "Invalid enum value 'dancing' - at `$.state`",
        id="unknown-heartbeat-state",
    ),
    pytest.param(
        msgspec.msgpack.encode(
            {
                "kind": "hello",
                "version": PROTOCOL_VERSION,
                "executor": "torch",
                "pid": 1,
                "hostname": "h",
                "workdir": "/w",
                "state": "Training",
            }
        ),
        EXECUTOR_MESSAGES,
        "Invalid enum value 'Training' - at `$.state`",
        id="unknown-hello-state",
    ),
    pytest.param(
        msgspec.msgpack.encode(
            {
                "kind": "start",
                "spec": {"name": "j", "steps": 1},
                "epoch": 1,
                "rendezvous": {
                    "node_rank": 0,
                    "addresses": ["10.0.0.1"],
                    "master_port": 29500,
                    "backend": "mpi",
                },
            }
        ),
        CONSOLE_MESSAGES,
        "Invalid enum value 'mpi' - at `$.rendezvous.backend`",
        id="unknown-backend",
    ),
    pytest.param(
        msgspec.msgpack.encode({"kind": "stop", "reason": "a deposed leader's stop"}),
        CONSOLE_MESSAGES,
        'Invalid enum value "a deposed leader\'s stop" - at `$.reason`',
        id="unknown-stop-reason",
    ),
    pytest.param(
        msgspec.msgpack.encode({"kind": "drain", "reason": "GPU warning"}),
        CONSOLE_MESSAGES,
        "Invalid enum value 'GPU warning' - at `$.reason`",
        id="unknown-drain-reason",
    ),
    pytest.param(
        msgspec.msgpack.encode({"kind": "stopped", "step": 1, "reason": "idle: no console"}),
        EXECUTOR_MESSAGES,
        "Invalid enum value 'idle: no console' - at `$.reason`",
        id="unknown-stopped-reason",
    ),
    pytest.param(
        msgspec.msgpack.encode(
            {"kind": "run_ended", "step": 1, "fault": "crashed", "message": "m", "exit_code": 1}
        ),
        EXECUTOR_MESSAGES,
        "Invalid enum value 'crashed' - at `$.fault`",
        id="unknown-run-ended-fault",
    ),
    pytest.param(
        msgspec.msgpack.encode([1, 2, 3]),
        EXECUTOR_MESSAGES,
        "invalid executor->console message: Expected `object`, got `array`",
        id="array-not-map",
    ),
]


@pytest.mark.parametrize(("payload", "decoder", "words"), BAD_PAYLOADS)
def test_bad_payloads_are_protocol_errors(
    payload: bytes, decoder: MessageDecoder[Any], words: str
) -> None:
    with pytest.raises(ProtocolError) as e:
        FrameBuffer(decoder).feed(_frame(payload))
    assert words in str(e.value)
    assert "\n" not in str(e.value)


def test_peer_text_in_an_error_is_one_bounded_line() -> None:
    with pytest.raises(ProtocolError) as e:
        CONSOLE_MESSAGES.decode(msgspec.msgpack.encode({"kind": "a\nb\r\x00c"}))
    assert str(e.value) == (
        "unknown console->executor message kind: Invalid value 'a\\x0ab\\x0d\\x00c' - at `$.kind`"
    )
    with pytest.raises(ProtocolError) as e:
        CONSOLE_MESSAGES.decode(msgspec.msgpack.encode({"kind": "k" * 1_000_000}))
    assert len(str(e.value)) < 500
    assert str(e.value).startswith("unknown console->executor message kind: Invalid value 'kkk")
    assert str(e.value).endswith("kkk' - at `$.kind`")


def test_good_frames_before_a_bad_one_are_delivered_then_the_error() -> None:
    """Like a stream reader, FrameBuffer hands out what came before the bad frame."""
    fault = EXECUTOR_EXAMPLES[10]
    chunk = encode_frame(fault) + _frame(b"\xc1") + encode_frame(fault)
    buf = FrameBuffer(EXECUTOR_MESSAGES)
    assert buf.feed(chunk) == [fault]
    with pytest.raises(ProtocolError, match="malformed"):
        buf.feed(encode_frame(fault))  # the link is dead: nothing more is decoded
    with pytest.raises(ProtocolError, match="malformed"):
        buf.close()


@pytest.mark.parametrize(
    "msg",
    [m for m in EXECUTOR_EXAMPLES if not isinstance(m, ExecutorHello)],
    ids=_ids([m for m in EXECUTOR_EXAMPLES if not isinstance(m, ExecutorHello)]),
)
def test_executor_message_sent_to_the_executor_is_refused(msg: Any) -> None:
    with pytest.raises(ProtocolError, match="console->executor message"):
        FrameBuffer(CONSOLE_MESSAGES).feed(encode_frame(msg))


@pytest.mark.parametrize(
    "msg",
    [m for m in CONSOLE_EXAMPLES if not isinstance(m, ConsoleHello)],
    ids=_ids([m for m in CONSOLE_EXAMPLES if not isinstance(m, ConsoleHello)]),
)
def test_console_message_sent_to_the_console_is_refused(msg: Any) -> None:
    with pytest.raises(ProtocolError, match="executor->console message"):
        FrameBuffer(EXECUTOR_MESSAGES).feed(encode_frame(msg))


def test_console_hello_is_not_an_executor_hello() -> None:
    with pytest.raises(ProtocolError, match="missing required field `executor`"):
        EXECUTOR_MESSAGES.decode(encode_frame(CONSOLE_EXAMPLES[0])[4:])


def test_check_hello() -> None:
    check_hello(ConsoleHello(version=PROTOCOL_VERSION), ConsoleHello)
    check_hello(EXECUTOR_EXAMPLES[0], ExecutorHello)
    with pytest.raises(
        ProtocolError,
        match=f"peer speaks protocol version {PROTOCOL_VERSION + 1}, this side speaks {PROTOCOL_VERSION}",
    ):
        check_hello(ConsoleHello(version=PROTOCOL_VERSION + 1), ConsoleHello)
    with pytest.raises(ProtocolError, match="protocol version 0"):
        check_hello(msgspec.structs.replace(EXECUTOR_EXAMPLES[0], version=0), ExecutorHello)
    with pytest.raises(ProtocolError, match="expected ConsoleHello as the first frame, got Start"):
        check_hello(CONSOLE_EXAMPLES[2], ConsoleHello)
    with pytest.raises(
        ProtocolError, match="expected ExecutorHello as the first frame, got Heartbeat"
    ):
        check_hello(EXECUTOR_EXAMPLES[2], ExecutorHello)


def test_check_hello_after_decoding_a_newer_peer() -> None:
    """A peer of a later version decodes (extra fields ignored), then check_hello refuses it."""
    payload = msgspec.msgpack.encode(
        {"kind": "hello", "version": PROTOCOL_VERSION + 1, "console_id": "c", "new_field": [1]}
    )
    msg = CONSOLE_MESSAGES.decode(payload)
    assert msg == ConsoleHello(version=PROTOCOL_VERSION + 1, console_id="c")
    with pytest.raises(ProtocolError, match="version"):
        check_hello(msg, ConsoleHello)


# ------------------------------------------------------------------------ asyncio


def _reader(data: bytes, eof: bool = True) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    if eof:
        reader.feed_eof()
    return reader


async def test_read_message_round_trip_and_clean_eof() -> None:
    reader = _reader(b"".join(encode_frame(m) for m in EXECUTOR_EXAMPLES))
    got = [await read_message(reader, EXECUTOR_MESSAGES, timeout=5) for _ in EXECUTOR_EXAMPLES]
    assert got == EXECUTOR_EXAMPLES
    assert await read_message(reader, EXECUTOR_MESSAGES, timeout=5) is None
    assert await read_message(_reader(b""), EXECUTOR_MESSAGES) is None


@pytest.mark.parametrize(
    ("cut", "words"),
    [
        (1, "truncated frame header: 1 of 4 bytes"),
        (3, "truncated frame header: 3 of 4 bytes"),
        (4, "truncated frame: connection closed after 0 of"),
        (9, "truncated frame: connection closed after 5 of"),
    ],
)
async def test_read_message_eof_mid_frame(cut: int, words: str) -> None:
    frame = encode_frame(EXECUTOR_EXAMPLES[4])
    with pytest.raises(ProtocolError, match=words):
        await read_message(_reader(frame[:cut]), EXECUTOR_MESSAGES, timeout=5)


async def test_read_message_times_out_on_a_silent_stream() -> None:
    reader = _reader(b"", eof=False)
    t0 = time.monotonic()
    with pytest.raises(ProtocolError, match=r"timed out after 0.2s waiting for a frame"):
        await read_message(reader, CONSOLE_MESSAGES, timeout=0.2)
    assert 0.15 < time.monotonic() - t0 < 3


async def test_read_message_times_out_mid_frame() -> None:
    reader = _reader(encode_frame(Ping(nonce=1))[:7], eof=False)
    with pytest.raises(ProtocolError, match="timed out"):
        await read_message(reader, CONSOLE_MESSAGES, timeout=0.2)


async def test_write_message_to_read_message_over_a_unix_socket(tmp_path: Path) -> None:
    got: asyncio.Queue[Any] = asyncio.Queue()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (msg := await read_message(reader, CONSOLE_MESSAGES, timeout=5)) is not None:
            await got.put(msg)
        await got.put(None)
        writer.close()

    server = await asyncio.start_unix_server(serve, path=str(tmp_path / "s"))
    async with server:
        _, writer = await asyncio.open_unix_connection(str(tmp_path / "s"))
        for m in CONSOLE_EXAMPLES:
            await write_message(writer, m)
        writer.write_eof()
        received = [await asyncio.wait_for(got.get(), 5) for _ in range(len(CONSOLE_EXAMPLES) + 1)]
        writer.close()
        await writer.wait_closed()
    assert received == [*CONSOLE_EXAMPLES, None]


# ------------------------------------------------------------------------ fuzzing


def _run_frame_buffer(
    data: bytes, cuts: list[int], decoder: MessageDecoder[Any], max_frame: int = MAX_FRAME
) -> tuple[list[Any], ProtocolError | None]:
    """Feed bytes the way a connection would, then end the stream; only ProtocolError may escape."""
    buf = FrameBuffer(decoder, max_frame=max_frame)
    out: list[Any] = []
    error: ProtocolError | None = None
    try:
        prev = 0
        for cut in [*sorted(cuts), len(data)]:
            out += buf.feed(data[prev:cut])
            prev = cut
        buf.close()
    except ProtocolError as e:
        error = e
    if error is not None:
        assert str(error)
        assert "\n" not in str(error)
    return out, error


def _valid_types(decoder: MessageDecoder[Any]) -> tuple[type, ...]:
    return tuple(_union_types(ConsoleMessage if decoder is CONSOLE_MESSAGES else ExecutorMessage))


async def _drain_async(data: bytes, decoder: MessageDecoder[Any]) -> tuple[list[Any], Any]:
    reader = _reader(data)
    out: list[Any] = []
    # every frame consumes at least 4 bytes, so this bounds a reader that made no progress
    for _ in range(len(data) // 4 + 2):
        error: ProtocolError | None = None
        try:
            msg = await read_message(reader, decoder, timeout=5)
        except ProtocolError as e:
            error = e
        if error is not None:
            # all bytes are already there and EOF is fed: waiting can never be the answer
            assert "timed out" not in str(error), f"hung on {len(data)} fed bytes: {error}"
            return out, error
        if msg is None:
            return out, None
        out.append(msg)
    raise AssertionError("read_message kept returning messages past the end of the data")


@pytest.fixture(scope="module")
def runner() -> Iterator[asyncio.Runner]:
    with asyncio.Runner() as r:
        yield r


def _check_both(data: bytes, cuts: list[int], decoder: MessageDecoder[Any], runner: Any) -> None:
    out, err = _run_frame_buffer(data, cuts, decoder)
    assert all(isinstance(m, _valid_types(decoder)) for m in out)
    aout, aerr = runner.run(_drain_async(data, decoder))
    assert all(isinstance(m, _valid_types(decoder)) for m in aout)
    # the two readers agree on what the bytes mean
    assert aout == out
    assert (aerr is None) == (err is None), (err, aerr)


decoders = st.sampled_from([CONSOLE_MESSAGES, EXECUTOR_MESSAGES])


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=64), cuts=st.lists(st.integers(0, 64), max_size=4), decoder=decoders)
def test_fuzz_random_bytes_1500(data: bytes, cuts: list[int], decoder: MessageDecoder[Any]) -> None:
    out, _ = _run_frame_buffer(data, [c for c in cuts if c <= len(data)], decoder)
    assert all(isinstance(m, _valid_types(decoder)) for m in out)
    # with a small limit most random headers are refused at once
    out, _ = _run_frame_buffer(data, [], decoder, max_frame=16)
    assert all(isinstance(m, _valid_types(decoder)) for m in out)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(payloads=st.lists(st.binary(max_size=40), min_size=1, max_size=3), decoder=decoders)
def test_fuzz_random_payloads_in_valid_frames_1000(
    payloads: list[bytes], decoder: MessageDecoder[Any]
) -> None:
    data = b"".join(_frame(p) for p in payloads)
    out, err = _run_frame_buffer(data, [], decoder)
    assert all(isinstance(m, _valid_types(decoder)) for m in out)
    if err is None:
        assert len(out) == len(payloads)


MUTATIONS = ["flip", "truncate", "insert", "delete", "length", "length_delta"]


@st.composite
def mutated_streams(draw: st.DrawFn) -> tuple[bytes, MessageDecoder[Any], str]:
    direction = draw(st.sampled_from(["console", "executor"]))
    pool, decoder = (
        (CONSOLE_EXAMPLES, CONSOLE_MESSAGES)
        if direction == "console"
        else (EXECUTOR_EXAMPLES, EXECUTOR_MESSAGES)
    )
    msgs = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=3))
    frames = [encode_frame(m) for m in msgs]
    data = bytearray(b"".join(frames))
    kind = draw(st.sampled_from(MUTATIONS))
    for _ in range(draw(st.integers(1, 3))):
        pos = draw(st.integers(0, max(0, len(data) - 1)))
        if kind == "flip" and data:
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif kind == "truncate":
            del data[pos:]
        elif kind == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete":
            del data[pos : pos + draw(st.integers(1, 8))]
        elif kind in ("length", "length_delta"):
            # rewrite the header of one of the frames
            i = draw(st.integers(0, len(frames) - 1))
            start = sum(len(f) for f in frames[:i])
            if start + 4 > len(data):
                continue
            (old,) = struct.unpack_from(">I", data, start)
            new = (
                draw(st.integers(0, 2**32 - 1))
                if kind == "length"
                else max(0, old + draw(st.integers(-8, 8)))
            )
            struct.pack_into(">I", data, start, new)
    return bytes(data), decoder, kind


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=mutated_streams(), cuts=st.lists(st.integers(0, 4096), max_size=6))
def test_fuzz_mutated_frames_sync_and_async_600(
    case: tuple[bytes, MessageDecoder[Any], str], cuts: list[int], runner: asyncio.Runner
) -> None:
    data, decoder, _ = case
    _check_both(data, [c for c in cuts if c <= len(data)], decoder, runner)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=64), decoder=decoders)
def test_fuzz_random_bytes_async_300(
    data: bytes, decoder: MessageDecoder[Any], runner: asyncio.Runner
) -> None:
    _check_both(data, [], decoder, runner)


# ------------------------------------------------------------------------ imports


def test_protocol_imports_nothing_forbidden() -> None:
    code = """
import importlib, json, pkgutil, sys
import protocol
names = sorted("protocol." + m.name for m in pkgutil.iter_modules(protocol.__path__))
for name in names:
    importlib.import_module(name)
forbidden = {"torch", "textual", "asyncssh", "console", "executors", "numpy", "pynvml"}
bad = sorted(m for m in sys.modules if m.split(".")[0] in forbidden)
print(json.dumps({"modules": names, "bad": bad}))
"""
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert {"protocol.framing", "protocol.messages", "protocol.config", "protocol.spec"} <= set(
        result["modules"]
    )
    assert result["bad"] == []
