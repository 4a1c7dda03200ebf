"""A PyTorch Lightning script written as its users write one: a LightningModule, a DataLoader,
``ModelCheckpoint(dirpath=..., save_top_k=-1, every_n_train_steps=8)`` saving
``epoch=E-step=S.ckpt`` (8 batches an epoch), ``trainer.fit(..., ckpt_path=...)`` to resume.
It knows nothing of hotspare.

    python train_lightning.py --ckpt-dir DIR [--ckpt-path FILE] [--max-steps N] [--step-s S]

Deterministic on CPU (no shuffling, no dropout, a fixed seed), so a run resumed from any of
its checkpoints ends with the parameters of an uninterrupted one (``params sha256 HEX`` at
the end). (Saved with ``every_n_epochs=1`` instead, Lightning 2.6 resumes one batch short of
the epoch's end and the data shifts by a batch: not bit-exact.)
"""

from __future__ import annotations

import argparse
import hashlib
import time
import warnings

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

BATCHES_PER_EPOCH = 8


class Regressor(L.LightningModule):
    def __init__(self, step_s: float) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)
        )
        self.step_s = step_s

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        print(f"step {self.global_step + 1} loss {loss.item():.6f}", flush=True)
        if self.step_s:
            time.sleep(self.step_s)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--ckpt-path", default=None)
    p.add_argument("--max-steps", type=int, default=64)
    p.add_argument("--step-s", type=float, default=0.0)
    args = p.parse_args()
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    L.seed_everything(0, workers=True)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(BATCHES_PER_EPOCH * 4, 8, generator=g)
    data = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True).sin()), batch_size=4)
    model = Regressor(args.step_s)
    trainer = L.Trainer(
        max_steps=args.max_steps,
        accelerator="cpu",
        devices=1,
        deterministic=True,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[ModelCheckpoint(dirpath=args.ckpt_dir, save_top_k=-1, every_n_train_steps=8)],
    )
    trainer.fit(model, data, ckpt_path=args.ckpt_path or None)
    h = hashlib.sha256()
    for t in model.state_dict().values():
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    print(f"params sha256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
