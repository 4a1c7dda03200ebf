"""A plain DDP training script that knows nothing of hotspare: the subject of
benchmarks/multihost_torchrun.py.

    torchrun ... ddp_plain.py --checkpoint-dir DIR [--steps N] [--save-every K]
        [--step-time S] [--width W] [--step-log FILE] [--timeout S]

Reads its rank and world from the environment torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT); gloo on the CPU. A 2-layer MLP trained deterministically: the
global batch of step N depends only on N, and its 12 rows are split evenly over 1, 2, 3, 4 or
6 ranks, so a job that comes back at another world size still trains on the same global
batch. ``--step-time`` paces each step to at least that long (the tiny model takes about a
millisecond), so a supervisor can be watched stepping.

Every ``--save-every`` steps and at the end, local rank 0 of each node writes ``ckpt-STEP.pt``
(temp name, rename, then ``ckpt-STEP.pt.done``) into its node's own ``--checkpoint-dir`` and
keeps the newest two. On start the ranks agree on the newest complete step any node holds and
the first rank that holds it sends the state to the others, so a node with an empty folder
(a new or replaced host) resumes too.

Each line it prints (to stdout, and appended to ``--step-log``, flushed at once) ends with its
pid and ``time.time()``::

    proc t0=T0 pid=P t=T                           started (T0: before torch was imported)
    loaded step=S world=W rank=R pid=P t=T         joined the group, state of step S loaded
    step N loss=L world=W rank=R pid=P t=T         step N completed
    saved N pid=P t=T                              checkpoint N complete (its marker written)
"""

from __future__ import annotations

import time

T0 = time.time()

import argparse  # noqa: E402
import datetime  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, TextIO  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

GLOBAL_BATCH = 12
KEEP = 2
CKPT = re.compile(r"^ckpt-(\d+)\.pt$")


class Out:
    """Each line to stdout and to the log file, flushed."""

    def __init__(self, log: Path | None) -> None:
        self._log: TextIO | None = open(log, "a") if log else None  # noqa: SIM115

    def __call__(self, text: str) -> None:
        line = f"{text} pid={os.getpid()} t={time.time():.6f}"
        print(line, flush=True)
        if self._log is not None:
            self._log.write(line + "\n")
            self._log.flush()


def build_model(width: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width)
    )


def shard(step: int, width: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's rows of the global batch of ``step`` (a pure function of the step)."""
    g = torch.Generator().manual_seed(1_000_003 * step + 17)
    x = torch.randn(GLOBAL_BATCH, width, generator=g)
    y = torch.tanh(x.flip(1))
    per = GLOBAL_BATCH // world
    return x[rank * per : (rank + 1) * per], y[rank * per : (rank + 1) * per]


def complete_steps(folder: Path) -> dict[int, Path]:
    found = {}
    for p in folder.glob("ckpt-*.pt"):
        m = CKPT.match(p.name)
        if m and (folder / f"{p.name}.done").exists():
            found[int(m.group(1))] = p
    return found


def save(state: dict[str, Any], folder: Path, step: int) -> None:
    path = folder / f"ckpt-{step}.pt"
    tmp = folder / f".ckpt-{step}.pt.tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)
    (folder / f"{path.name}.done").touch()
    for old in sorted(complete_steps(folder))[:-KEEP]:
        (folder / f"ckpt-{old}.pt").unlink(missing_ok=True)
        (folder / f"ckpt-{old}.pt.done").unlink(missing_ok=True)


def resume(folder: Path, rank: int, world: int) -> dict[str, Any] | None:
    """The state of the newest complete step any node holds, from the first rank holding it."""
    held = complete_steps(folder)
    newest = torch.tensor([max(held, default=0)])
    dist.all_reduce(newest, op=dist.ReduceOp.MAX)
    step = int(newest.item())
    if step == 0:
        return None
    source = torch.tensor([rank if step in held else world])
    dist.all_reduce(source, op=dist.ReduceOp.MIN)
    box = [torch.load(held[step], weights_only=True) if rank == int(source.item()) else None]
    dist.broadcast_object_list(box, src=int(source.item()))
    return box[0]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint-dir", type=Path, required=True)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--save-every", type=int, default=20)
    p.add_argument("--step-time", type=float, default=0.0, help="pace each step to >= S seconds")
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--step-log", type=Path)
    p.add_argument("--timeout", type=float, default=60.0, help="collective timeout, seconds")
    args = p.parse_args()
    out = Out(args.step_log)
    out(f"proc t0={T0:.6f}")
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    if GLOBAL_BATCH % world:
        raise SystemExit(f"world size {world} does not divide the global batch {GLOBAL_BATCH}")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    args.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    model = build_model(args.width)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    step = 0
    state = resume(args.checkpoint_dir, rank, world)
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        step = int(state["step"])
    ddp = DistributedDataParallel(model)
    out(f"loaded step={step} world={world} rank={rank}")
    while step < args.steps:
        began = time.monotonic()
        step += 1
        x, y = shard(step, args.width, rank, world)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        out(f"step {step} loss={loss.item():.6f} world={world} rank={rank}")
        if local_rank == 0 and (step % args.save_every == 0 or step == args.steps):
            state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}
            save(state, args.checkpoint_dir, step)
            out(f"saved {step}")
        time.sleep(max(0.0, args.step_time - (time.monotonic() - began)))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
