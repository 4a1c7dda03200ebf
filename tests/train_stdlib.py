"""A training script with no torch: the job of console tests whose subject is the console
(its views, reports, spares, leases), where what trains does not matter but a process that
trains, checkpoints, resumes and finishes does. It starts in tens of milliseconds; a torch
job's executor spends about 2 CPU s importing torch and torch._dynamo, most of the suite's CPU.

    python train_stdlib.py --checkpoint-dir DIR [--resume PATH] [--steps N] [--save-every K]
        [--step-s S] [--seed S]

The "model" is 16 floats fitted by SGD to a target drawn from the seed; the batch of step N
depends only on the seed and N, so a run resumed from any of its checkpoints ends with the
same floats, bit for bit, as one never stopped. It saves ``ckpt-STEP.json`` every K steps
and at the end (written to a temp name, renamed, then marked complete by ``NAME.done``),
resumes from ``--resume``, prints ``step N loss L`` per step and ``params sha256 HEX`` at the
end. On SIGTERM it saves a checkpoint at the current step and exits 0.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import signal
import struct
import sys
import time
from pathlib import Path

SIZE = 16
stop_requested = False


def on_sigterm(_signum: int, _frame: object) -> None:
    global stop_requested
    stop_requested = True


def save(params: list[float], step: int, folder: Path) -> None:
    path = folder / f"ckpt-{step}.json"
    tmp = folder / f".ckpt-{step}.json.tmp"
    tmp.write_text(json.dumps({"step": step, "params": [p.hex() for p in params]}))
    os.replace(tmp, path)
    (folder / f"{path.name}.done").touch()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--checkpoint-dir", type=Path, required=True)
    p.add_argument("--resume", type=Path)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--save-every", type=int, default=20)
    p.add_argument("--step-s", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    signal.signal(signal.SIGTERM, on_sigterm)
    target = [random.Random(args.seed).uniform(-1, 1) for _ in range(SIZE)]
    params, step = [0.0] * SIZE, 0
    if args.resume:
        ck = json.loads(args.resume.read_text())
        params, step = [float.fromhex(x) for x in ck["params"]], int(ck["step"])
    print(
        f"resume {json.dumps(str(args.resume) if args.resume else None)} at step {step}", flush=True
    )
    args.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    saved = step
    while step < args.steps:
        step += 1
        rng = random.Random(args.seed * 1_000_003 + step)
        noise = [rng.gauss(0, 0.1) for _ in range(SIZE)]
        grads = [p - t + n for p, t, n in zip(params, target, noise, strict=True)]
        params = [p - 0.05 * g for p, g in zip(params, grads, strict=True)]
        loss = sum(g * g for g in grads) / SIZE
        print(f"step {step} loss {loss:.6f}", flush=True)
        if step % args.save_every == 0 or step == args.steps:
            save(params, step, args.checkpoint_dir)
            saved = step
        if stop_requested:
            if saved != step:
                save(params, step, args.checkpoint_dir)
            print(f"got SIGTERM; saved step {step}, exiting", flush=True)
            return 0
        if args.step_s:
            time.sleep(args.step_s)
    digest = hashlib.sha256(struct.pack(f"<{SIZE}d", *params)).hexdigest()
    print(f"params sha256 {digest}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
