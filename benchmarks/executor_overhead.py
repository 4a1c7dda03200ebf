"""Executor overhead: steps/s of the charlm workload under hotspare against the same loop in plain torch.

Three processes per round, interleaved (plain, serve, run, plain, ...) so that drift in the
machine's load hits each alike:

- ``plain``: the workload's own model, data, optimizer and scheduler (executors/kinds/torch/workloads/
  charlm.py ``build``, same seed), stepped by a bare loop: batch, loss, backward, clip,
  step, zero_grad. No events, no checkpoints.
- ``serve``: a real job as the console runs it: ``hotspare-executor serve --spec``, with
  heartbeats and health samples every second, every event written to the workdir's log
  and sent to a connected console (this script, on the Unix socket), async checkpoints.
- ``run``: ``hotspare-executor run --json`` by hand: events to the log and to stdout,
  async checkpoints.

Steady state only: each process trains ``--warmup`` steps first (imports, allocator, the
first checkpoint's page cache), then the rate is timed over the next ``--steps`` steps, for
hotspare from the arrival times of its Progress events. Reports the median ratio over the
rounds. Target: hotspare >= 98% of plain.

    python benchmarks/executor_overhead.py [--rounds 3] [--steps 200] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from common import Figure, at_least, emit

CONFIG: dict[str, Any] = {
    "n_layer": 4,
    "n_head": 4,
    "n_embd": 128,
    "block_size": 64,
    "global_batch": 16,
}
SEED = 1
TARGET = 0.98
START_TIMEOUT_S = 120.0
EXECUTOR = [sys.executable, "-m", "executors.cli"]


def spec_toml(steps: int, every_s: float) -> str:
    config = "\n".join(f"{k} = {json.dumps(v)}" for k, v in CONFIG.items())
    return (
        f'name = "overhead"\nworkload = "charlm"\nsteps = {steps}\nseed = {SEED}\n'
        f"checkpoint_every_s = {every_s}\nkeep_checkpoints = 2\n\n[config]\n{config}\n"
    )


# ------------------------------------------------------------------ plain torch


def plain_worker(warmup: int, steps: int) -> None:
    """The bare loop, in its own process; prints its steady-state steps/s as one JSON line."""
    import torch

    from executors.kinds.torch import rng
    from executors.kinds.torch.workload import WorkloadContext
    from executors.kinds.torch.workloads.charlm import build

    rng.seed_all(SEED)
    wl = build(dict(CONFIG), WorkloadContext(seed=SEED, device=torch.device("cpu")))
    t0 = 0.0
    for i in range(warmup + steps):
        if i == warmup:
            t0 = time.perf_counter()
        x, y = wl.batch(i)
        loss = wl.loss((x, y))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(wl.model.parameters(), wl.grad_clip)
        wl.optimizer.step()
        if wl.scheduler is not None:
            wl.scheduler.step()
        wl.optimizer.zero_grad(set_to_none=True)
    print(json.dumps({"steps_per_s": steps / (time.perf_counter() - t0)}), flush=True)


def run_plain(warmup: int, steps: int, timeout: float) -> float:
    proc = subprocess.run(
        [
            sys.executable,
            __file__,
            "--plain-worker",
            "--warmup",
            str(warmup),
            "--steps",
            str(steps),
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"plain loop exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
    return float(json.loads(proc.stdout.strip().splitlines()[-1])["steps_per_s"])


# --------------------------------------------------------------------- hotspare


class Window:
    """Steady-state rate from (arrival time, step) of Progress events."""

    def __init__(self, warmup: int, steps: int) -> None:
        self.first_step, self.last_step = warmup, warmup + steps
        self.start: tuple[float, int] | None = None
        self.end: tuple[float, int] | None = None
        self.checkpoints = 0

    def progress(self, step: int) -> bool:
        """Record one Progress; True once the window is complete."""
        now = time.monotonic()
        if self.start is None and step >= self.first_step:
            self.start = (now, step)
        elif self.start is not None and step >= self.last_step:
            self.end = (now, step)
        return self.end is not None

    def rate(self) -> float:
        assert self.start is not None and self.end is not None
        return (self.end[1] - self.start[1]) / (self.end[0] - self.start[0])


def _stop(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def run_cli(folder: Path, window: Window, every_s: float, timeout: float) -> float:
    folder.mkdir(parents=True)
    spec = folder / "job.toml"
    spec.write_text(spec_toml(10 * window.last_step, every_s))
    cmd = [*EXECUTOR, "run", "--spec", str(spec), "--workdir", str(folder / "w"), "--json"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    deadline = time.monotonic() + timeout
    watchdog = threading.Timer(timeout, proc.kill)  # a silent executor cannot block the read
    watchdog.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            event = json.loads(line)
            if event.get("kind") == "checkpoint" and window.start is not None:
                window.checkpoints += 1
            if event.get("kind") == "progress" and window.progress(int(event["step"])):
                return window.rate()
            if time.monotonic() > deadline:
                raise TimeoutError(f"run: no steady-state window within {timeout:g} s")
        raise RuntimeError(f"run: the executor exited {proc.wait(timeout=60)} before the window")
    finally:
        watchdog.cancel()
        _stop(proc)


def run_serve(folder: Path, window: Window, every_s: float, timeout: float) -> float:
    from protocol.framing import EXECUTOR_MESSAGES, recv_message, send_message
    from protocol.messages import PROTOCOL_VERSION, CheckpointSaved, ConsoleHello, Progress

    folder.mkdir(parents=True)
    spec = folder / "job.toml"
    spec.write_text(spec_toml(10 * window.last_step, every_s))
    workdir = folder / "w"
    cmd = [*EXECUTOR, "serve", "--workdir", str(workdir), "--spec", str(spec)]
    cmd += ["--heartbeat-s", "1", "--health-s", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout
    sock = socket.socket(socket.AF_UNIX)
    try:
        while True:  # the socket appears once the executor has started serving
            try:
                sock.connect(str(workdir / "executor.sock"))
                break
            except (FileNotFoundError, ConnectionRefusedError):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"serve: no socket (exit {proc.poll()})") from None
                time.sleep(0.05)
        sock.settimeout(30)
        send_message(sock, ConsoleHello(version=PROTOCOL_VERSION, console_id="bench"))
        while time.monotonic() < deadline:
            msg = recv_message(sock, EXECUTOR_MESSAGES)
            if msg is None:
                raise RuntimeError(f"serve: the executor closed the socket (exit {proc.poll()})")
            if isinstance(msg, CheckpointSaved) and window.start is not None:
                window.checkpoints += 1
            if isinstance(msg, Progress) and window.progress(msg.step):
                return window.rate()
        raise TimeoutError(f"serve: no steady-state window within {timeout:g} s")
    finally:
        sock.close()
        _stop(proc)


# ------------------------------------------------------------------------ main


def main() -> None:
    try:
        measure()
    except (RuntimeError, OSError, ValueError, subprocess.SubprocessError) as e:
        print(f"executor_overhead: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)


def measure() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=30, help="steps before timing starts")
    ap.add_argument("--steps", type=int, default=200, help="timed steps per process")
    ap.add_argument("--checkpoint-every-s", type=float, default=5.0)
    ap.add_argument("--quick", action="store_true", help="1 round, 10 + 40 steps")
    ap.add_argument("--json", action="store_true", help="also print one JSON line last")
    ap.add_argument("--plain-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.plain_worker:
        plain_worker(args.warmup, args.steps)
        return
    if args.quick:
        args.rounds, args.warmup, args.steps, args.checkpoint_every_s = 1, 10, 40, 2.0
    if min(args.rounds, args.warmup, args.steps) < 1 or args.checkpoint_every_s <= 0:
        ap.error("--rounds, --warmup, --steps and --checkpoint-every-s must be positive")
    plain: list[float] = []
    served: list[float] = []
    ran: list[float] = []
    checkpoints = {"serve": 0, "run": 0}
    timeout = START_TIMEOUT_S + 10 * args.steps
    with tempfile.TemporaryDirectory(prefix="eo-", dir=os.environ.get("HOTSPARE_BENCH_DIR")) as d:
        for r in range(args.rounds):
            plain.append(run_plain(args.warmup, args.steps, timeout))
            w = Window(args.warmup, args.steps)
            served.append(run_serve(Path(d) / f"s{r}", w, args.checkpoint_every_s, timeout))
            checkpoints["serve"] += w.checkpoints
            w = Window(args.warmup, args.steps)
            ran.append(run_cli(Path(d) / f"r{r}", w, args.checkpoint_every_s, timeout))
            checkpoints["run"] += w.checkpoints
            print(
                f"round {r + 1}: plain {plain[-1]:.2f}, serve {served[-1]:.2f}, "
                f"run {ran[-1]:.2f} steps/s",
                file=sys.stderr,
            )
    ratio_serve = statistics.median(s / p for s, p in zip(served, plain, strict=True))
    ratio_run = statistics.median(s / p for s, p in zip(ran, plain, strict=True))
    bar = f">= {TARGET:.0%}"
    figures = [
        Figure("plain torch", statistics.median(plain), "steps/s"),
        Figure("hotspare serve (a console's job)", statistics.median(served), "steps/s"),
        Figure("hotspare run --json", statistics.median(ran), "steps/s"),
        Figure(
            "serve / plain (median of rounds)",
            100 * ratio_serve,
            "%",
            bar,
            at_least(ratio_serve, TARGET),
        ),
        Figure(
            "run / plain (median of rounds)", 100 * ratio_run, "%", bar, at_least(ratio_run, TARGET)
        ),
    ]
    notes = (
        f"charlm {CONFIG}, cpu, {os.cpu_count()} CPUs, {platform.machine()}; {args.rounds} rounds "
        f"interleaved, {args.warmup} warm-up + {args.steps} timed steps each; checkpoint every "
        f"{args.checkpoint_every_s:g} s ({checkpoints['serve']} and {checkpoints['run']} in the "
        "serve and run windows); heartbeat and health every 1 s"
    )
    emit("executor_overhead", figures, notes, args.json)


if __name__ == "__main__":
    main()
