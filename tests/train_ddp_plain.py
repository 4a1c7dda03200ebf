"""A plain DDP training script that knows nothing of hotspare: run by torchrun on each host.

    torchrun --nnodes N --node-rank R --master-addr A --master-port P --nproc-per-node L \
        train_ddp_plain.py --checkpoint-dir DIR [--resume PATH] [--steps N] [--save-every K]
        [--backend gloo] [--timeout-s S] [--step-s S] [--seed S] [--metrics-file PATH]

Each rank trains its slice of a global batch that depends only on the seed and the step, so
a run at the same world size is deterministic. Local rank 0 of every node saves
``ckpt-STEP.pt`` (temp file, rename, then ``NAME.done``) every K steps and at the end: there
is no shared filesystem, each node keeps its own copy. Every rank resumes from ``--resume``.
Local rank 0 prints ``step N loss L`` per step and ``params sha256 HEX`` at the end; with
``--metrics-file`` it prints nothing and appends ``{"step": N, "loss": L}`` lines to that file
instead, as most training scripts log (a worker that never writes to the executor's pipes
lives on when its executor dies: no EPIPE ends it).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

GLOBAL_BATCH = 64


def params_sha256(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def save(state: dict, folder: Path, step: int) -> None:
    path, tmp = folder / f"ckpt-{step}.pt", folder / f".ckpt-{step}.pt.tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)
    (folder / f"{path.name}.done").touch()


def batch(seed: int, step: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's slice of the step's global batch."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    x = torch.randn(GLOBAL_BATCH, 8, generator=g)[rank::world]
    return x, torch.sin(x.sum(dim=1, keepdim=True))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--checkpoint-dir", type=Path, required=True)
    p.add_argument("--resume", type=Path)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--save-every", type=int, default=10)
    p.add_argument("--backend", default="gloo")
    p.add_argument("--timeout-s", type=float, default=30.0)
    p.add_argument("--step-s", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--metrics-file", type=Path)
    args = p.parse_args()
    dist.init_process_group(args.backend, timeout=timedelta(seconds=args.timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()
    speaks = int(os.environ["LOCAL_RANK"]) == 0
    log = open(args.metrics_file, "a") if speaks and args.metrics_file else None  # noqa: SIM115

    def say(line: str, **record: object) -> None:
        if log is not None:
            log.write(json.dumps(record) + "\n")
            log.flush()
        elif speaks:
            print(line, flush=True)

    torch.manual_seed(args.seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    step = 0
    if args.resume:
        ck = torch.load(args.resume, weights_only=True)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        step = ck["step"]
    where = json.dumps(str(args.resume) if args.resume else None)
    say(f"resume {where} at step {step} (rank {rank} of {world})", resumed=step)
    ddp = DistributedDataParallel(model)
    args.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    while step < args.steps:
        step += 1
        x, y = batch(args.seed, step, rank, world)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if speaks:
            say(f"step {step} loss {loss.item():.6f}", step=step, loss=round(loss.item(), 6))
            if step % args.save_every == 0 or step == args.steps:
                state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}
                save(state, args.checkpoint_dir, step)
        if args.step_s:
            time.sleep(args.step_s)
    digest = params_sha256(model)
    say(f"params sha256 {digest}", params_sha256=digest)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
