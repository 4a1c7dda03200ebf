"""A plain PyTorch training script that knows nothing of hotspare: the ``command`` kind's subject.

    python train_plain.py --checkpoint-dir DIR [--resume PATH] [--steps N] [--save-every K]
        [--marker] [--metrics FILE] [--step-s S] [--seed S] [--echo TEXT]...

It trains a tiny model deterministically (the batch of step N depends only on the seed and
N), saves ``ckpt-STEP.pt`` every K steps and at the end, resumes from ``--resume``, prints
``step N loss L`` per step and ``params sha256 HEX`` at the end. With ``--marker`` a
checkpoint is written to a temp name, renamed, then marked complete by ``NAME.done``;
without, it is written in place (a reader must wait for it to settle). On SIGTERM it saves
a checkpoint at the current step and exits 0.

Faults on purpose, by environment: ``TRAIN_HANG_AFTER=N`` sleeps forever after step N
(ignoring SIGTERM); ``TRAIN_TORN_AT=N`` writes half of step N's checkpoint slowly, in place
and without a marker, then dies. ``TRAIN_ECHO_ENV=NAME`` prints that variable as JSON.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import signal
import sys
import time
import warnings
from pathlib import Path

import torch

stop_requested = False


def on_sigterm(_signum: int, _frame: object) -> None:
    global stop_requested
    stop_requested = True


def params_sha256(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def save(state: dict, folder: Path, step: int, marker: bool) -> None:
    path = folder / f"ckpt-{step}.pt"
    if not marker:
        torch.save(state, path)
        return
    tmp = folder / f".ckpt-{step}.pt.tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)
    (folder / f"{path.name}.done").touch()


def torn_write(state: dict, folder: Path, step: int) -> None:
    buf = io.BytesIO()
    torch.save(state, buf)
    half = buf.getvalue()[: len(buf.getvalue()) // 2]
    with open(folder / f"ckpt-{step}.pt", "wb") as f:
        for i in range(10):
            f.write(half[i * len(half) // 10 : (i + 1) * len(half) // 10])
            f.flush()
            time.sleep(0.1)
    print(f"dying in the middle of writing checkpoint {step}", flush=True)
    os._exit(3)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--checkpoint-dir", type=Path, required=True)
    p.add_argument("--resume", type=Path)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--save-every", type=int, default=10)
    p.add_argument("--marker", action="store_true")
    p.add_argument("--metrics", type=Path)
    p.add_argument("--step-s", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--echo", action="append", default=[])
    p.add_argument("--warn", action="store_true", help="a FutureWarning on stderr at start")
    args = p.parse_args()
    if args.warn:  # as many real scripts do (a deprecated argument, a library's notice)
        warnings.warn("`foo` is deprecated and will be removed", FutureWarning, stacklevel=1)
    signal.signal(signal.SIGTERM, on_sigterm)
    for text in args.echo:
        print("echo " + json.dumps(text), flush=True)
    if name := os.environ.get("TRAIN_ECHO_ENV"):
        print("env " + json.dumps(os.environ.get(name)), flush=True)
    hang_after = int(os.environ.get("TRAIN_HANG_AFTER", "0"))
    torn_at = int(os.environ.get("TRAIN_TORN_AT", "0"))

    torch.manual_seed(args.seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    step = 0
    if args.resume:
        ck = torch.load(args.resume, weights_only=True)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        step = ck["step"]
    print(
        f"resume {json.dumps(str(args.resume) if args.resume else None)} at step {step}", flush=True
    )
    args.checkpoint_dir.mkdir(parents=True, exist_ok=True)

    def state() -> dict:
        return {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}

    saved = step
    while step < args.steps:
        step += 1
        g = torch.Generator().manual_seed(args.seed * 1_000_003 + step)
        x = torch.randn(64, 8, generator=g)
        y = torch.sin(x.sum(dim=1, keepdim=True))
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"step {step} loss {loss.item():.6f}", flush=True)
        if args.metrics:
            with open(args.metrics, "a") as f:
                f.write(json.dumps({"step": step, "loss": loss.item()}) + "\n")
        if step == hang_after:
            print(f"hanging after step {step}", flush=True)
            while True:
                time.sleep(3600)
        if step == torn_at:
            torn_write(state(), args.checkpoint_dir, step)
        if step % args.save_every == 0 or step == args.steps:
            save(state(), args.checkpoint_dir, step, args.marker)
            saved = step
        if stop_requested:
            if saved != step:
                save(state(), args.checkpoint_dir, step, args.marker)
            print(f"got SIGTERM; saved step {step}, exiting", flush=True)
            return 0
        if args.step_s:
            time.sleep(args.step_s)
    print(f"params sha256 {params_sha256(model)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
