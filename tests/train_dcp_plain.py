"""A plain training script that checkpoints with torch.distributed.checkpoint (a folder a step).

    python train_dcp_plain.py --checkpoint-dir DIR [--resume FOLDER] [--steps N]
        [--save-every K] [--step-s S] [--seed S]

It knows nothing of hotspare. The batch of step N depends only on the seed and N. Every K
steps and at the end it saves ``DIR/ckpt-STEP/`` with ``dcp.save`` (shard files, then
``.metadata`` last), resumes from ``--resume`` with ``dcp.load``, prints ``step N loss L``
per step and ``params sha256 HEX`` at the end.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict


def params_sha256(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--checkpoint-dir", type=Path, required=True)
    p.add_argument("--resume", type=Path)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--save-every", type=int, default=10)
    p.add_argument("--step-s", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    torch.manual_seed(args.seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    step = 0
    if args.resume:
        model_sd, optim_sd = get_state_dict(model, opt)
        state = {"model": model_sd, "optim": optim_sd, "step": 0}
        dcp.load(state, checkpoint_id=args.resume, no_dist=True)
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        step = state["step"]
    where = json.dumps(str(args.resume) if args.resume else None)
    print(f"resume {where} at step {step}", flush=True)
    args.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    while step < args.steps:
        step += 1
        g = torch.Generator().manual_seed(args.seed * 1_000_003 + step)
        x = torch.randn(64, 8, generator=g)
        loss = torch.nn.functional.mse_loss(model(x), torch.sin(x.sum(dim=1, keepdim=True)))
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"step {step} loss {loss.item():.6f}", flush=True)
        if step % args.save_every == 0 or step == args.steps:
            model_sd, optim_sd = get_state_dict(model, opt)
            state = {"model": model_sd, "optim": optim_sd, "step": step}
            dcp.save(state, checkpoint_id=args.checkpoint_dir / f"ckpt-{step}", no_dist=True)
        if args.step_s:
            time.sleep(args.step_s)
    print(f"params sha256 {params_sha256(model)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
