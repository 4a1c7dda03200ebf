"""Elastic jobs: steps/s of one job of 3 logical ranks at 3 members, shrunk to 2, grown back to
3, with the plain all-reduce and with ``deterministic_reduce``, side by side.

Real ``hotspare-executor serve`` members, real gloo on loopback, each phase started as the
console starts an epoch (a Start with the rendezvous; a shrunk group renumbered, resuming the
committed step; the grown group's new member given a copy of a shard). Per phase, the rate is
timed from the arrival of rank 0's Progress events (one per step) after ``--warmup`` steps.
The deterministic reduce gathers every logical rank's gradients (W x widest block x the
gradient size per rank) where the plain one all-reduces one vector: the ratio det/plain is its
cost. On a machine with fewer cores than members, the members share them (then 3 members run
slower than 2: the figures compare the reduces, not the sizes).

    python benchmarks/elastic_reduce.py [--warmup 5] [--steps 40] [--quick] [--json]
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
from common import Figure, emit

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from executors.fencing.publish import checkpoint_name  # noqa: E402
from protocol.framing import EXECUTOR_MESSAGES, recv_message, send_message  # noqa: E402
from protocol.messages import (  # noqa: E402
    PROTOCOL_VERSION,
    ConsoleHello,
    ExecutorMessage,
    Finished,
    Progress,
    Rendezvous,
    RunEnded,
    Start,
    Stopped,
)
from protocol.spec import JobSpec  # noqa: E402

LOGICAL = 3
PHASES = (("3 ranks", 3), ("2 ranks (3 logical)", 2), ("3 ranks again", 3))
CONFIG = {
    "n_layer": 2,
    "n_head": 4,
    "n_embd": 128,
    "block_size": 128,
    "global_batch": 24,
    "micro_batch": 8,
    "dropout": 0.1,
    "corpus_chars": 50_000,
}
EXECUTOR = [sys.executable, "-m", "executors.cli"]
TIMEOUT_S = 300.0


@dataclass
class Member:
    work: Path
    proc: subprocess.Popen[bytes]
    sock: socket.socket
    arrivals: dict[int, float] = field(default_factory=dict)

    def recv(self) -> ExecutorMessage:
        msg = recv_message(self.sock, EXECUTOR_MESSAGES)
        if msg is None:
            raise RuntimeError(f"{self.work.name}: the executor closed its socket")
        if isinstance(msg, Progress):
            self.arrivals.setdefault(msg.step, time.monotonic())
        return msg


def serve(works: list[Path]) -> list[Member]:
    env = dict(os.environ, OMP_NUM_THREADS="1", HOTSPARE_PROGRESS_S="0")
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    procs = [
        subprocess.Popen(
            [*EXECUTOR, "serve", "--workdir", str(w), "--heartbeat-s", "1", "--health-s", "5"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
            cwd=REPO,
        )
        for w in works
    ]
    return [Member(w, p, _connect(w, p)) for w, p in zip(works, procs, strict=True)]


def _connect(work: Path, proc: subprocess.Popen[bytes]) -> socket.socket:
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        sock = socket.socket(socket.AF_UNIX)
        try:
            sock.connect(str(work / "executor.sock"))
            break
        except (FileNotFoundError, ConnectionRefusedError):
            sock.close()
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{work.name}: no socket (exit {proc.poll()})") from None
            time.sleep(0.05)
    sock.settimeout(TIMEOUT_S)
    send_message(sock, ConsoleHello(version=PROTOCOL_VERSION, console_id="bench"))
    recv_message(sock, EXECUTOR_MESSAGES)  # ExecutorHello
    return sock


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def phase(
    members: list[Member], spec: JobSpec, *, epoch: int, resume: int | None, det: bool
) -> str:
    """Train every member to ``spec.steps``; rank 0's params digest. The members exit."""
    port = free_port()
    for rank, m in enumerate(members):
        rv = Rendezvous(
            node_rank=rank,
            addresses=["127.0.0.1"] * len(members),
            master_port=port,
            resume_step=resume,
            timeout_s=60,
            logical_ranks=LOGICAL,
            deterministic_reduce=det,
        )
        send_message(m.sock, Start(spec=spec, epoch=epoch, rendezvous=rv))
    digests = []
    for m in members:
        while True:
            msg = m.recv()
            if isinstance(msg, (RunEnded, Stopped)):
                raise RuntimeError(f"{m.work.name}: the run ended early: {msg}")
            if isinstance(msg, Finished):
                digests.append(msg.params_sha256)
                break
    for m in members:
        m.sock.close()
        m.proc.wait(timeout=60)
    if len(set(digests)) != 1:
        raise RuntimeError(f"the members ended with different parameters: {digests}")
    return digests[0]


def rate(m: Member, first: int, last: int) -> float:
    """Steps/s from the median time between rank 0's consecutive steps ``first``..``last``: a
    step slowed by another process on the machine does not move it."""
    gaps = [m.arrivals[s + 1] - m.arrivals[s] for s in range(first, last)]
    return 1.0 / statistics.median(gaps)


def group_of(root: Path, i: int, per: int) -> list[Path]:
    """Phase ``i``'s members' workdirs: 3; old ranks 0 and 2 renumbered 0 and 1 (old rank 2's
    shard loads as rank 1's); those two and a new member given a copy of a shard."""
    works = [root / f"w{n}" for n in range(3)]
    if i == 0:
        return works
    if i == 1:
        return [works[0], works[2]]
    step = works[0] / "checkpoints" / checkpoint_name(2 * per)
    dest = root / "w3" / "checkpoints"
    dest.mkdir(parents=True)
    for suffix in (".pt", ".json"):  # a promoted replica
        shutil.copy2(step.with_suffix(suffix), dest / step.with_suffix(suffix).name)
    return [works[2], root / "w3", works[0]]


def run(root: Path, warmup: int, steps: int) -> dict[bool, list[float]]:
    """Both reduces through 3 -> 2 -> 3 members, ``warmup + steps`` steps a phase; each phase
    of one right after the same phase of the other (so drift in the machine's load hits both
    alike). Steps/s per phase, by reduce."""
    per = warmup + steps
    base = JobSpec(name="elastic", steps=per, seed=3, checkpoint_every_steps=10**6, config=CONFIG)
    rates: dict[bool, list[float]] = {False: [], True: []}
    for i, (_, size) in enumerate(PHASES):
        for det in (False, True):
            group = group_of(root / f"det-{det}", i, per)
            assert len(group) == size
            members = serve(group)
            try:
                spec = msgspec.structs.replace(base, steps=per * (i + 1))
                phase(members, spec, epoch=i + 1, resume=per * i or None, det=det)
            finally:
                for m in members:
                    if m.proc.poll() is None:
                        m.proc.kill()
                        m.proc.wait()
            rates[det].append(rate(members[0], per * i + warmup, per * (i + 1)))
    return rates


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--warmup", type=int, default=5, help="steps of each phase before timing")
    ap.add_argument("--steps", type=int, default=40, help="timed steps per phase")
    ap.add_argument("--quick", action="store_true", help="3 + 15 steps per phase")
    ap.add_argument("--json", action="store_true", help="also print one JSON line last")
    args = ap.parse_args()
    if args.quick:
        args.warmup, args.steps = 3, 15
    if args.warmup < 1 or args.steps < 1:
        ap.error("--warmup and --steps must be positive")
    load = os.getloadavg()[0]
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="er-", dir=os.environ.get("HOTSPARE_BENCH_DIR")) as d:
        results = run(Path(d), args.warmup, args.steps)
    took = time.monotonic() - t0
    print("| phase | members | plain steps/s | deterministic steps/s | det/plain |")
    print("|---|---|---|---|---|")
    figures = []
    for i, (name, size) in enumerate(PHASES):
        plain, det = results[False][i], results[True][i]
        print(f"| {name} | {size} | {plain:.2f} | {det:.2f} | {det / plain:.2f} |")
        figures += [
            Figure(f"{name}: plain steps/s", plain, "steps/s"),
            Figure(f"{name}: deterministic steps/s", det, "steps/s"),
            Figure(f"{name}: det/plain", det / plain, "x"),
        ]
    notes = (
        f"charlm {CONFIG['n_layer']}x{CONFIG['n_embd']}, global batch {CONFIG['global_batch']} "
        f"over {LOGICAL} logical ranks, {args.warmup} + {args.steps} steps per phase, gloo on "
        f"loopback, {os.cpu_count()} CPUs (load {load:.1f} at the start), {took:.0f} s in all"
    )
    print()
    emit("elastic_reduce", figures, notes, args.json)


if __name__ == "__main__":
    main()
