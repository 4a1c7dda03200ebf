"""Simulated executors for benchmarks: N Unix sockets, one per executor, each speaking the real
protocol (ConsoleHello -> ExecutorHello, then a Heartbeat and a Health every period).

Run as its own process so that its CPU is not counted against the console::

    python benchmarks/simexec.py --dir D --count 1000 --parent PID

Executor ``i`` listens on ``socket_path(D, i)``. Sends are spread evenly over the period (executor
``i`` at phase ``i / count``) with +-5 % jitter. It prints ``ready`` once every socket listens,
and one JSON line of its own figures when it stops: on SIGTERM/SIGINT, when its parent is gone,
or after ``--max-s``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from protocol.errors import ProtocolError
from protocol.framing import (
    CONSOLE_MESSAGES,
    check_hello,
    encode_frame,
    read_message,
    write_message,
)
from protocol.messages import (
    PROTOCOL_VERSION,
    ConsoleHello,
    ExecutorHello,
    GpuHealth,
    Health,
    Heartbeat,
)

HELLO_TIMEOUT_S = 10.0
SEND_TIMEOUT_S = 5.0
JITTER = 0.05
GPU_NAME = "NVIDIA H100 80GB HBM3"
GPU_MEM_MB = 81559.0
DISK_TOTAL_MB = 1_800_000.0


def socket_path(root: Path, i: int) -> Path:
    """Where simulated executor ``i`` listens (short enough for a Unix socket path)."""
    return root / f"h{i:04d}" / "e.sock"


def host_name(i: int) -> str:
    return f"h{i:04d}"


class Stats:
    def __init__(self) -> None:
        self.connections = 0
        self.health_sent = 0
        self.late_max_s = 0.0


class SimHost:
    """One host's counters, drifting a little each sample like a busy training host."""

    def __init__(self, i: int, gpus: int) -> None:
        self.rng = random.Random(i)
        self.busy = self.rng.random() < 0.8
        hot = self.rng.random() < 0.01  # a few hosts sit above the temperature WARN line
        self.util = [95.0 if self.busy else 0.0] * gpus
        self.mem = [(70_000.0 if self.busy else 500.0) for _ in range(gpus)]
        self.temp = [(87.0 if hot and g == 0 else 62.0 if self.busy else 34.0) for g in range(gpus)]
        self.power = [(610.0 if self.busy else 70.0) for _ in range(gpus)]
        self.replays = [self.rng.randrange(0, 50) for _ in range(gpus)]
        self.disk_free = self.rng.uniform(200_000, 1_500_000)

    def sample(self) -> Health:
        r = self.rng
        gpus = []
        for g in range(len(self.util)):
            if self.busy:
                self.util[g] = min(100.0, max(60.0, self.util[g] + r.uniform(-3, 3)))
                self.mem[g] = min(GPU_MEM_MB, max(40_000.0, self.mem[g] + r.uniform(-200, 200)))
                self.power[g] = min(700.0, max(300.0, self.power[g] + r.uniform(-25, 25)))
            if r.random() < 0.1:
                self.temp[g] += r.choice((-1.0, 1.0))
            if r.random() < 0.01:
                self.replays[g] += 1
            gpus.append(
                GpuHealth(
                    index=g,
                    name=GPU_NAME,
                    util_pct=float(round(self.util[g])),
                    mem_used_mb=round(self.mem[g], 1),
                    mem_total_mb=GPU_MEM_MB,
                    temp_c=self.temp[g],
                    power_w=round(self.power[g], 3),
                    ecc_corrected=0,
                    ecc_uncorrected=0,
                    retired_pages_sbe=0,
                    retired_pages_dbe=0,
                    remapped_rows_corrected=0,
                    remapped_rows_uncorrected=0,
                    remap_pending=False,
                    remap_failure=False,
                    pcie_replays=self.replays[g],
                )
            )
        self.disk_free = max(10_000.0, self.disk_free - r.uniform(0, 5))
        return Health(
            t=time.time(),
            cpu_pct=round(r.uniform(20, 40) if self.busy else r.uniform(0, 3), 1),
            mem_used_pct=round(r.uniform(40, 60) if self.busy else r.uniform(5, 8), 1),
            mem_available_mb=round(r.uniform(500_000, 900_000), 1),
            disk_free_mb=round(self.disk_free, 1),
            disk_total_mb=DISK_TOTAL_MB,
            disk_read_bps=round(r.uniform(0, 5e8)),
            disk_write_bps=round(r.uniform(0, 1e8)),
            net_rx_bps=round(r.uniform(0, 2e9)),
            net_tx_bps=round(r.uniform(0, 2e9)),
            gpu_status="ok",
            gpus=tuple(gpus),
        )


class SimExecutor:
    def __init__(self, i: int, count: int, period: float, gpus: int, t0: float, stats: Stats):
        self.i = i
        self.period = period
        self.phase = t0 + period * i / count
        self.host = SimHost(i, gpus)
        self.stats = stats
        self.seq = 0
        self.slot = -1

    def _next_slot(self, now: float) -> float:
        """The next slot after the last one sent; slots missed while late are skipped, not burst."""
        self.slot = max(self.slot + 1, int((now - self.phase) // self.period))
        jitter = self.period * self.host.rng.uniform(-JITTER, JITTER)
        return self.phase + self.slot * self.period + jitter

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        drain: asyncio.Task[None] | None = None
        try:
            hello = await read_message(reader, CONSOLE_MESSAGES, timeout=HELLO_TIMEOUT_S)
            if hello is None:
                return
            check_hello(hello, ConsoleHello)
            self.stats.connections += 1
            await write_message(
                writer,
                ExecutorHello(
                    version=PROTOCOL_VERSION,
                    executor="sim",
                    pid=os.getpid(),
                    hostname=host_name(self.i),
                    workdir="",
                    state="idle",
                ),
                timeout=SEND_TIMEOUT_S,
            )
            drain = asyncio.create_task(_discard(reader))
            loop = asyncio.get_running_loop()
            while not drain.done():
                slot = self._next_slot(loop.time())
                await asyncio.sleep(max(0.0, slot - loop.time()))
                self.stats.late_max_s = max(self.stats.late_max_s, loop.time() - slot)
                self.seq += 1
                beat = Heartbeat(seq=self.seq, t=time.time(), state="idle", step=0, epoch=0)
                writer.write(encode_frame(beat) + encode_frame(self.host.sample()))
                async with asyncio.timeout(SEND_TIMEOUT_S):
                    await writer.drain()
                self.stats.health_sent += 1
        except (ProtocolError, OSError, TimeoutError):
            pass
        finally:
            if drain is not None:
                drain.cancel()
            writer.close()


async def _discard(reader: asyncio.StreamReader) -> None:
    """Read what the console sends (nothing is acted on) until it closes the connection."""
    with contextlib.suppress(OSError):
        while await reader.read(65536):
            pass


async def serve(args: argparse.Namespace) -> None:
    root = Path(args.dir)
    stats = Stats()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    t0 = loop.time() + 0.5
    servers: list[asyncio.Server] = []
    try:
        for i in range(args.count):
            path = socket_path(root, i)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.unlink(missing_ok=True)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.bind(str(path))
            os.chmod(path, 0o600)
            sim = SimExecutor(i, args.count, args.period, args.gpus, t0, stats)
            servers.append(await asyncio.start_unix_server(sim.handle, sock=sock, backlog=64))
        print("ready", flush=True)
        deadline = loop.time() + args.max_s
        while not stop.is_set() and loop.time() < deadline and os.getppid() == args.parent:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)
    finally:
        for server in servers:
            server.close()
        for i in range(args.count):
            socket_path(root, i).unlink(missing_ok=True)
    cpu, wall = time.process_time(), loop.time() - t0
    print(
        json.dumps(
            {
                "connections": stats.connections,
                "health_sent": stats.health_sent,
                "cpu_pct": round(100 * cpu / max(wall, 1e-9), 1),
                "late_max_ms": round(1000 * stats.late_max_s, 1),
            }
        ),
        flush=True,
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", required=True, help="folder for the executors' sockets")
    p.add_argument("--count", type=int, default=1000)
    p.add_argument("--period", type=float, default=1.0, help="seconds between health samples")
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--parent", type=int, default=os.getppid(), help="exit when this pid is gone")
    p.add_argument("--max-s", type=float, default=900.0, help="exit after this long regardless")
    asyncio.run(serve(p.parse_args()))


if __name__ == "__main__":
    main()
