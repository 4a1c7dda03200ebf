"""A training script written the way nanoGPT's ``train.py`` is: ``--key=value`` overrides of
module-level settings, one checkpoint file ``out_dir/ckpt.pt`` rewritten in place every
``eval_interval`` iterations, resumed with ``--init_from=resume`` from that fixed path, a
line ``iter N: loss L`` per iteration. It knows nothing of hotspare.

    python train_nanogpt_style.py [--out_dir=DIR] [--max_iters=N] [--eval_interval=K]
        [--init_from=scratch|resume] [--iter_s=S] [--seed=S]

Deterministic: iteration N's batch depends only on the seed and N, so a run resumed from any
checkpoint ends with the parameters of an uninterrupted one (``params sha256 HEX`` at the end).
"""

from __future__ import annotations

import hashlib
import os
import sys
import time

import torch

out_dir = "out"
max_iters = 200
eval_interval = 20
init_from = "scratch"
iter_s = 0.0
seed = 1337

for arg in sys.argv[1:]:  # nanoGPT's configurator, in short: --key=value overrides a global
    key, _, value = arg.removeprefix("--").partition("=")
    if key not in globals() or key.startswith("_"):
        raise SystemExit(f"unknown config key: {key}")
    globals()[key] = type(globals()[key])(value)

torch.manual_seed(seed)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
iter_num = 0
ckpt_path = os.path.join(out_dir, "ckpt.pt")
if init_from == "resume":
    checkpoint = torch.load(ckpt_path, map_location="cpu")
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    iter_num = checkpoint["iter_num"]
    print(f"resuming from iter {iter_num}", flush=True)
os.makedirs(out_dir, exist_ok=True)


def get_batch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed * 100_003 + i)
    x = torch.randn(8, 16, generator=g)
    return x, x.sum(dim=1, keepdim=True).sin()


while True:
    if iter_num % eval_interval == 0 and iter_num > 0:
        checkpoint = {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "iter_num": iter_num,
        }
        torch.save(checkpoint, ckpt_path)  # in place, as nanoGPT does
    if iter_num >= max_iters:
        break
    x, y = get_batch(iter_num)
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    print(f"iter {iter_num}: loss {loss.item():.4f}", flush=True)
    if iter_s:
        time.sleep(iter_s)
    iter_num += 1

h = hashlib.sha256()
for name, t in model.state_dict().items():
    h.update(name.encode())
    h.update(t.detach().contiguous().numpy().tobytes())
print(f"params sha256 {h.hexdigest()}", flush=True)
