"""A plain training script that knows nothing of hotspare (nor of torchrun): the subject of
benchmarks/restart_vs_torchrun.py.

    python restart_plain.py --checkpoint-dir DIR [--resume PATH] [--steps N] [--save-every K]
        [--width W] [--layers L] [--batch B] [--step-log FILE]

A ``--layers``-deep MLP of ``--width`` (4 x 1448: 8.4M parameters; with Adam's two moments a
checkpoint of about 100 MB) trained deterministically: the batch of step N depends only on N.
Every ``--save-every`` steps and at the end it writes ``ckpt-STEP.pt`` (temp name, rename,
then ``ckpt-STEP.pt.done``) and keeps the newest two. It resumes from ``--resume`` when given,
else from the newest complete checkpoint in ``--checkpoint-dir`` (so a supervisor that only
restarts it, like torchrun, resumes too).

Each line it prints (to stdout, and appended to ``--step-log`` when given, flushed at once) carries
its pid and ``time.time()``, so a benchmark reads its timeline from the script itself::

    proc t0=T0 pid=P t=T        started (T0: read before torch was imported)
    loaded step=S pid=P t=T     model built, checkpoint S loaded (0: a fresh start)
    step N loss=L pid=P t=T     step N completed
    saved N pid=P t=T           checkpoint N complete (its marker written)
"""

from __future__ import annotations

import time

T0 = time.time()

import argparse  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import TextIO  # noqa: E402

import torch  # noqa: E402

WIDTH = 1448
LAYERS = 4
BATCH = 32
KEEP = 2
CKPT = re.compile(r"^ckpt-(\d+)\.pt$")


def build_model(width: int, layers: int) -> torch.nn.Module:
    blocks: list[torch.nn.Module] = []
    for i in range(layers):
        blocks.append(torch.nn.Linear(width, width))
        if i < layers - 1:
            blocks.append(torch.nn.ReLU())
    return torch.nn.Sequential(*blocks)


def make_batch(step: int, width: int, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch of step ``step``: a pure function of the step."""
    g = torch.Generator().manual_seed(1_000_003 * step + 17)
    x = torch.randn(batch, width, generator=g)
    return x, torch.tanh(x.flip(1))


def newest_complete(folder: Path) -> Path | None:
    steps = []
    for p in folder.glob("ckpt-*.pt"):
        m = CKPT.match(p.name)
        if m and (folder / f"{p.name}.done").exists():
            steps.append((int(m.group(1)), p))
    return max(steps)[1] if steps else None


def save(state: dict, folder: Path, step: int) -> None:
    path = folder / f"ckpt-{step}.pt"
    tmp = folder / f".ckpt-{step}.pt.tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)
    (folder / f"{path.name}.done").touch()
    olds = sorted(
        (int(m.group(1)), p) for p in folder.glob("ckpt-*.pt") if (m := CKPT.match(p.name))
    )
    for _, p in olds[:-KEEP]:
        p.unlink(missing_ok=True)
        (folder / f"{p.name}.done").unlink(missing_ok=True)


class Out:
    """Each line to stdout and to the log file, flushed."""

    def __init__(self, log: Path | None) -> None:
        self._log: TextIO | None = open(log, "a") if log else None  # noqa: SIM115

    def __call__(self, text: str) -> None:
        line = f"{text} pid={os.getpid()}"
        print(f"{line} t={time.time():.6f}", flush=True)
        if self._log is not None:
            self._log.write(f"{line} t={time.time():.6f}\n")
            self._log.flush()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint-dir", type=Path, required=True)
    p.add_argument("--resume", type=Path)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--save-every", type=int, default=20)
    p.add_argument("--width", type=int, default=WIDTH)
    p.add_argument("--layers", type=int, default=LAYERS)
    p.add_argument("--batch", type=int, default=BATCH)
    p.add_argument("--step-log", type=Path)
    args = p.parse_args()
    out = Out(args.step_log)
    out(f"proc t0={T0:.6f}")
    args.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = build_model(args.width, args.layers)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    step = 0
    resume = args.resume or newest_complete(args.checkpoint_dir)
    if resume is not None:
        ck = torch.load(resume, weights_only=True)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        step = int(ck["step"])
    out(f"loaded step={step}")
    while step < args.steps:
        step += 1
        x, y = make_batch(step, args.width, args.batch)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        out(f"step {step} loss={loss.item():.6f}")
        if step % args.save_every == 0 or step == args.steps:
            state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}
            save(state, args.checkpoint_dir, step)
            out(f"saved {step}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
