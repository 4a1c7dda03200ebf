"""restart_plain.py's model as a hotspare workload, for the torch kind's side of
benchmarks/restart_vs_torchrun.py: the same MLP, optimizer and batches, trained by the executor.

    workload = "restart_workload:build"   # benchmarks/ on the executor's PYTHONPATH
    [config]
    width = 1448
    layers = 4
    batch = 32
    log = "/tmp/.../steps.log"    # lines in restart_plain.py's format
    kill_at = 50                  # SIGKILL the process training, once, when step 50 is done
    crash = "kill"                # or "raise": the run raises instead (its executor stays)
    marker = "/tmp/.../killed"    # written (with the time) just before that SIGKILL
    kill_gate = "/tmp/.../twin.warm"   # optional: the kill waits until this file exists

The trainer calls ``batch(i)`` at the start of step ``i + 1``, once step ``i`` is complete (its
checkpoint and progress included), so the workload reads the trainer's timeline from those
calls: the first in a process is ``loaded step=i``, each later one ``step i``. The kill comes
from inside whatever process trains, so it hits the trainer whichever process that is.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import torch
from restart_plain import BATCH, LAYERS, WIDTH, build_model, make_batch

from executors.kinds.torch.workload import Workload, WorkloadContext, convert_config


class Config(msgspec.Struct, forbid_unknown_fields=True):
    width: int = WIDTH
    layers: int = LAYERS
    batch: int = BATCH
    log: str = ""
    kill_at: int = 0
    marker: str = ""
    crash: str = "kill"
    """kill: SIGKILL the process that trains; raise: an exception in the run (the executor lives)."""
    kill_gate: str = ""
    """A file the kill waits for (a warm twin's ``twin.warm``: the twin is up and warmed up)."""


class PlainMLP(Workload):
    def __init__(self, cfg: Config, ctx: WorkloadContext) -> None:
        self.cfg = cfg
        self.model = build_model(cfg.width, cfg.layers).to(ctx.device)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-4)
        self.global_batch = self.micro_batch = cfg.batch
        self._device = ctx.device
        self._first = True

    def _out(self, text: str) -> None:
        if self.cfg.log:
            with open(self.cfg.log, "a") as f:
                f.write(f"{text} pid={os.getpid()} t={time.time():.6f}\n")

    def batch(self, index: int) -> Sequence[torch.Tensor]:
        if self._first:
            self._first = False
            self._out(f"loaded step={index}")
        else:
            self._out(f"step {index} loss=0")
        if index == self.cfg.kill_at and self.cfg.marker and not Path(self.cfg.marker).exists():
            self._wait_gate()
            Path(self.cfg.marker).write_text(f"{time.time():.6f}\n")
            if self.cfg.crash == "raise":
                raise RuntimeError(f"benchmark: the run crashes at step {index}")
            os.kill(os.getpid(), signal.SIGKILL)
        x, y = make_batch(index + 1, self.cfg.width, self.cfg.batch)
        return x.to(self._device), y.to(self._device)

    def _wait_gate(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.cfg.kill_gate and not Path(self.cfg.kill_gate).exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"benchmark: no {self.cfg.kill_gate} within {timeout_s:g} s")
            time.sleep(0.01)

    def loss(self, micro: Sequence[torch.Tensor]) -> torch.Tensor:
        x, y = micro
        return torch.nn.functional.mse_loss(self.model(x), y)


def build(config: dict[str, Any], ctx: WorkloadContext) -> PlainMLP:
    return PlainMLP(convert_config(config, Config), ctx)
