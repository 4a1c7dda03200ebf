"""Checkpoint cost on a model whose checkpoint is 50+ MB: no checkpoints vs async vs synchronous saves.

Prints: the checkpoint size, the step time, one synchronous save, the async step-loop stall,
the extra training time each async checkpoint costs, and that cost as a share of training
time at one checkpoint every 30 s. Targets: overhead <= 1%, stall <= 10% of a sync save.

    python benchmarks/checkpoint_cost.py [--steps 40] [--every 10] [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch
from common import Figure, at_most, to_json

from executors.kinds.torch import rng
from executors.kinds.torch.trainer import Trainer
from protocol.spec import JobSpec

CONFIG = {
    "n_layer": 4,
    "n_head": 8,
    "n_embd": 320,
    "block_size": 64,
    "global_batch": 8,
    "dropout": 0.0,
}


def make_trainer(workdir: Path) -> Trainer:
    spec = JobSpec(
        name="bench", steps=10**9, checkpoint_every_steps=10**9, keep_checkpoints=2, config=CONFIG
    )
    t = Trainer(spec, workdir, lambda _msg: None, device=torch.device("cpu"))
    t._build()
    return t


def timed_steps(t: Trainer, steps: int, every: int, mode: str, stalls: list[float]) -> float:
    """Seconds for ``steps`` optimizer steps with a checkpoint every ``every`` steps in ``mode``."""
    t.ckpt.wait()
    start = time.perf_counter()
    for i in range(1, steps + 1):
        t._train_step()
        t.state.step += 1
        if mode != "none" and i % every == 0:
            if mode == "async":
                stalls.append(t.ckpt.save(t.state.step, full_state(t)))
            else:
                t.ckpt.save(t.state.step, full_state(t))
                t.ckpt.wait()
    elapsed = time.perf_counter() - start
    t.ckpt.wait()
    return elapsed


def full_state(t: Trainer) -> dict:
    return {
        "workload": t.workload.state_dict(),
        "train": t.state.state_dict(),
        "rng": rng.capture(),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="also print one JSON line last")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=os.environ.get("HOTSPARE_BENCH_DIR")) as d:
        t = make_trainer(Path(d))
        for _ in range(3):
            t._train_step()
        base, asyn, sync, stalls = [], [], [], []
        for _ in range(args.rounds):  # interleaved, so drift hits all three alike
            base.append(timed_steps(t, args.steps, args.every, "none", []))
            asyn.append(timed_steps(t, args.steps, args.every, "async", stalls))
            sync.append(timed_steps(t, args.steps, args.every, "sync", []))
        size = t.ckpt.last_saved.manifest.size if t.ckpt.last_saved else 0
        t.ckpt.close()
    n_ckpt = args.steps // args.every
    step_s = statistics.median(base) / args.steps
    sync_save = (statistics.median(sync) - statistics.median(base)) / n_ckpt
    async_extra = max(0.0, (statistics.median(asyn) - statistics.median(base)) / n_ckpt)
    stall = statistics.median(stalls)
    rows = [
        ("checkpoint size", f"{size / 1e6:.1f} MB", ">= 50 MB"),
        ("step time (no checkpoints)", f"{step_s * 1e3:.1f} ms", ""),
        ("synchronous save (torch.save + fsync, on the loop)", f"{sync_save:.3f} s", ""),
        (
            "async stall per checkpoint (median / max)",
            f"{stall * 1e3:.1f} / {max(stalls) * 1e3:.1f} ms",
            "",
        ),
        ("async stall / synchronous save", f"{100 * stall / sync_save:.1f} %", "<= 10 %"),
        ("async extra training time per checkpoint", f"{async_extra:.3f} s", ""),
        ("async overhead at one checkpoint per 30 s", f"{100 * async_extra / 30:.2f} %", "<= 1 %"),
    ]
    print(
        f"# checkpoint cost ({platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"{args.rounds} rounds x {args.steps} steps, checkpoint every {args.every})"
    )
    print("| figure | measured | target |\n|---|---|---|")
    for name, value, target in rows:
        print(f"| {name} | {value} | {target} |")
    if args.json:
        share = 100 * stall / sync_save
        overhead = 100 * async_extra / 30
        figures = [
            Figure("checkpoint size", size / 1e6, "MB", ">= 50 MB", size >= 50e6),
            Figure("step time (no checkpoints)", step_s * 1e3, "ms"),
            Figure("synchronous save (torch.save + fsync)", sync_save, "s"),
            Figure("async stall per checkpoint (median)", stall * 1e3, "ms"),
            Figure("async stall / synchronous save", share, "%", "<= 10 %", at_most(share, 10)),
            Figure("async extra training time per checkpoint", async_extra, "s"),
            Figure(
                "async overhead at one checkpoint per 30 s",
                overhead,
                "%",
                "<= 1 %",
                at_most(overhead, 1),
            ),
        ]
        notes = (
            f"{args.rounds} rounds x {args.steps} steps, checkpoint every {args.every}, "
            f"{os.cpu_count()} CPUs, torch {torch.__version__}"
        )
        print(to_json("checkpoint_cost", figures, notes), flush=True)


if __name__ == "__main__":
    main()
