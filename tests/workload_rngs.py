"""A test workload whose every step draws from Python's, numpy's and torch's global RNGs.

charlm draws from torch alone, so a resume that forgot to restore ``random`` or numpy would
still end bit-exact with it. Here each micro-batch's loss is perturbed by one draw from each
of the three, so the parameters after a resume match the uninterrupted run's only if all
three states came back. Used as ``workload = "workload_rngs:factory"``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from executors.kinds.torch.workload import Workload, WorkloadContext


class ThreeRngs(Workload):
    def __init__(self, ctx: WorkloadContext) -> None:
        g = torch.Generator().manual_seed(ctx.seed)
        self.model = torch.nn.Linear(8, 1)
        with torch.no_grad():
            self.model.weight.copy_(torch.randn(1, 8, generator=g))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05)
        self.global_batch = self.micro_batch = 16
        self._seed = ctx.seed

    def batch(self, index: int) -> Sequence[torch.Tensor]:
        g = torch.Generator().manual_seed(self._seed * 100_003 + index)
        x = torch.randn(self.global_batch, 8, generator=g)
        return x, x.sum(dim=1, keepdim=True)

    def loss(self, micro: Sequence[torch.Tensor]) -> torch.Tensor:
        x, y = micro
        noise = random.random() + float(np.random.rand()) + float(torch.rand(()))
        return torch.nn.functional.mse_loss(self.model(x) * (1.0 + 0.1 * noise), y)


def factory(config: dict[str, Any], ctx: WorkloadContext) -> Workload:
    return ThreeRngs(ctx)
